//! An exact latency histogram for the benches that time single calls (`latency.rs`,
//! `sweep.rs`): 1 ns buckets up to 100 µs, the rare longer samples kept one by one.

/// Latencies are counted in 1 ns buckets up to this bound, and kept exactly above it.
const HISTOGRAM_NS: usize = 100_000;

/// Exact latency distribution: 1 ns buckets, plus the rare outliers kept individually.
pub struct Histogram {
    buckets: Vec<u64>,
    outliers: Vec<u64>,
    /// Samples recorded.
    pub count: u64,
}

impl Histogram {
    pub fn new() -> Self {
        Histogram {
            buckets: vec![0; HISTOGRAM_NS],
            outliers: Vec::new(),
            count: 0,
        }
    }

    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.count += 1;
        match self.buckets.get_mut(ns as usize) {
            Some(bucket) => *bucket += 1,
            None => self.outliers.push(ns),
        }
    }

    /// The smallest value with at least `q` of the samples at or below it.
    pub fn quantile(&mut self, q: f64) -> u64 {
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count.max(1));
        let mut seen = 0;
        for (ns, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return ns as u64;
            }
        }
        self.outliers.sort_unstable();
        self.outliers[(rank - seen - 1) as usize]
    }

    pub fn max(&mut self) -> u64 {
        self.quantile(1.0)
    }

    /// How many samples took at least `ns`.
    pub fn at_least(&self, ns: u64) -> u64 {
        let bound = (ns as usize).min(HISTOGRAM_NS);
        self.buckets[bound..].iter().sum::<u64>()
            + self.outliers.iter().filter(|&&v| v >= ns).count() as u64
    }
}
