//! Randomness: one master seed, split into independent named streams.
//!
//! Every random choice of a run comes from the scenario's seed. Rather than passing one RNG
//! around (which would make each stream depend on how many numbers the others drew), each
//! consumer gets its own generator seeded by `derive_seed(master, stream, index)`: the demand of
//! node 3 is `("demand", 3)`, its network jitter `("net", 3)`, its limiter's retry jitter
//! `("hybrid", 3)`. A mode that makes more store calls then draws more network samples without
//! shifting the demand trace, so every mode sees exactly the same requests.
//!
//! The generator is ChaCha8 (`rand`), whose output for a given seed is fixed by its
//! specification; the derivation is SplitMix64 over an FNV-1a hash of the stream name, which is
//! written out here, so traces stay reproducible across platforms and dependency upgrades.

use rand::{RngExt, SeedableRng};

/// The generator used everywhere in the simulator.
pub type SimRng = rand::rngs::ChaCha8Rng;

/// FNV-1a, 64 bit: a tiny, stable hash (also used for trace hashes).
#[derive(Debug, Clone, Copy)]
pub struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv64 {
    /// Feeds bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// Feeds a `u64` (little-endian).
    pub fn write_u64(&mut self, v: u64) {
        self.write(&v.to_le_bytes());
    }

    /// The hash so far.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// One SplitMix64 step: a bijective, well-mixing map of 64-bit values.
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The seed of stream `stream`, number `index`, under `master`.
pub fn derive_seed(master: u64, stream: &str, index: u64) -> u64 {
    let mut h = Fnv64::default();
    h.write(stream.as_bytes());
    splitmix64(splitmix64(master ^ h.finish()) ^ splitmix64(index))
}

/// A generator for stream `stream`, number `index`.
pub fn rng_for(master: u64, stream: &str, index: u64) -> SimRng {
    SimRng::seed_from_u64(derive_seed(master, stream, index))
}

/// A uniform sample in `(0, 1]`, never 0, so its logarithm is finite.
pub fn unit_open(rng: &mut SimRng) -> f64 {
    1.0 - rng.random::<f64>()
}

/// An exponential sample with the given mean.
pub fn exponential(rng: &mut SimRng, mean: f64) -> f64 {
    -mean * unit_open(rng).ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_distinct_and_stable() {
        assert_ne!(derive_seed(1, "demand", 0), derive_seed(1, "demand", 1));
        assert_ne!(derive_seed(1, "demand", 0), derive_seed(1, "net", 0));
        assert_ne!(derive_seed(1, "demand", 0), derive_seed(2, "demand", 0));
        assert_eq!(derive_seed(1, "demand", 0), derive_seed(1, "demand", 0));
    }

    #[test]
    fn fnv_matches_the_reference_vector() {
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c.
        let mut h = Fnv64::default();
        h.write(b"a");
        assert_eq!(h.finish(), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn exponential_has_the_right_mean() {
        let mut rng = rng_for(7, "test", 0);
        let n = 100_000;
        let mean = (0..n).map(|_| exponential(&mut rng, 2.0)).sum::<f64>() / f64::from(n);
        assert!((mean - 2.0).abs() < 0.05, "{mean}");
    }
}
