//! Quotas: how many tokens per period, and how many may be spent at once.
//!
//! A [`Quota`] is validated once, at construction, so every limiter and store can rely on it:
//! the rate, the period and the burst are all non-zero, the period is a whole number of
//! microseconds (the resolution of the Redis clock), and the bucket fits the exact integer
//! arithmetic of the Lua script (see [`crate::algorithm::token_bucket`]). Invalid quotas cannot be represented.

use std::time::Duration;

use thiserror::Error;

/// Largest value any script argument may take: 2^52, so that every intermediate the script
/// computes stays an exact integer in a Lua double.
pub const MAX_VALUE: u64 = 1 << 52;

/// A token-bucket quota: `rate` tokens are added every `period`, up to `burst` tokens.
///
/// The long-run limit is `rate / period`; in any window of length `W` at most
/// `burst + rate × W / period` tokens can be spent.
///
/// ```
/// use std::time::Duration;
/// use ratelease::Quota;
///
/// // 1 000 requests per second, bursts of up to 100.
/// let quota = Quota::per_second(1_000)?.with_burst(100)?;
/// assert_eq!(quota.rate(), 1_000);
/// assert_eq!(quota.period(), Duration::from_secs(1));
/// assert_eq!(quota.burst(), 100);
/// # Ok::<(), ratelease::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    rate: u64,
    period_us: u64,
    burst: u64,
}

/// Why a [`Quota`] could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The rate was zero.
    #[error("rate must be at least 1 token per period")]
    ZeroRate,
    /// The period was shorter than one microsecond.
    #[error("period must be at least 1 µs")]
    ZeroPeriod,
    /// The period was not a whole number of microseconds.
    #[error("period must be a whole number of microseconds, got {0:?}")]
    SubMicrosecondPeriod(Duration),
    /// The burst was zero.
    #[error("burst must be at least 1 token")]
    ZeroBurst,
    /// A value is too large for exact arithmetic in the script.
    #[error("quota too large: {0}")]
    TooLarge(&'static str),
    /// The burst is too large for this rate and period: the shared bucket counts exact
    /// fractions of a token, and the finer the fractions a rate and period need, the smaller
    /// the largest burst (a rate that divides its period evenly allows the most).
    #[error(
        "burst {burst} is too large for {rate} tokens per {period:?}: at most {max_burst} with \
         this rate and period (a rate that divides the period evenly allows more; a quota's \
         burst is its rate unless set with `with_burst`)"
    )]
    BurstTooLarge {
        /// Tokens per period.
        rate: u64,
        /// The period.
        period: Duration,
        /// The burst asked for.
        burst: u64,
        /// The largest burst this rate and period allow.
        max_burst: u64,
    },
}

impl Quota {
    /// A quota of `rate` tokens per `period`, with a burst equal to `rate`.
    ///
    /// # Errors
    /// See [`QuotaError`]: zero or sub-microsecond values, or values too large for the script.
    pub fn new(rate: u64, period: Duration) -> Result<Self, QuotaError> {
        Self::with_parts(rate, period, rate)
    }

    /// `rate` tokens per second, burst = `rate`.
    ///
    /// # Errors
    /// As [`Quota::new`].
    pub fn per_second(rate: u64) -> Result<Self, QuotaError> {
        Self::new(rate, Duration::from_secs(1))
    }

    /// `rate` tokens per minute, burst = `rate`.
    ///
    /// # Errors
    /// As [`Quota::new`].
    pub fn per_minute(rate: u64) -> Result<Self, QuotaError> {
        Self::new(rate, Duration::from_secs(60))
    }

    /// `rate` tokens per hour, burst = `rate`.
    ///
    /// # Errors
    /// As [`Quota::new`].
    pub fn per_hour(rate: u64) -> Result<Self, QuotaError> {
        Self::new(rate, Duration::from_secs(3_600))
    }

    /// `rate` tokens per day (24 hours), burst = `rate`.
    ///
    /// # Errors
    /// As [`Quota::new`]. A day is long: the bucket counts exact fractions of a token, so a
    /// rate that shares no factor with the day's 86 400 000 000 µs allows a burst of at most
    /// 52 124 — `per_day(60_001)` is [`QuotaError::BurstTooLarge`], `per_day(60_000)` is
    /// fine (as is any rate whose factors the day's microseconds share; see the error's
    /// `max_burst`).
    pub fn per_day(rate: u64) -> Result<Self, QuotaError> {
        Self::new(rate, Duration::from_secs(86_400))
    }

    /// The same rate with another burst.
    ///
    /// # Errors
    /// As [`Quota::new`].
    pub fn with_burst(self, burst: u64) -> Result<Self, QuotaError> {
        Self::with_parts(self.rate, self.period(), burst)
    }

    /// A quota from all three parts.
    ///
    /// # Errors
    /// As [`Quota::new`].
    pub fn with_parts(rate: u64, period: Duration, burst: u64) -> Result<Self, QuotaError> {
        if rate == 0 {
            return Err(QuotaError::ZeroRate);
        }
        if burst == 0 {
            return Err(QuotaError::ZeroBurst);
        }
        if !period.subsec_nanos().is_multiple_of(1_000) {
            if period < Duration::from_micros(1) {
                return Err(QuotaError::ZeroPeriod);
            }
            return Err(QuotaError::SubMicrosecondPeriod(period));
        }
        let period_us = u64::try_from(period.as_micros())
            .map_err(|_| QuotaError::TooLarge("period is too long"))?;
        if period_us == 0 {
            return Err(QuotaError::ZeroPeriod);
        }
        if rate > MAX_VALUE {
            return Err(QuotaError::TooLarge("rate exceeds 2^52"));
        }
        if period_us > MAX_VALUE {
            return Err(QuotaError::TooLarge("period exceeds 2^52 µs"));
        }
        if burst > MAX_VALUE {
            return Err(QuotaError::TooLarge("burst exceeds 2^52"));
        }
        let quota = Quota {
            rate,
            period_us,
            burst,
        };
        if u128::from(burst) * u128::from(quota.scale()) > u128::from(MAX_VALUE) {
            return Err(QuotaError::BurstTooLarge {
                rate,
                period,
                burst,
                max_burst: MAX_VALUE / quota.scale(),
            });
        }
        Ok(quota)
    }

    /// Tokens added per period.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// The refill period.
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.period_us)
    }

    /// The refill period in microseconds.
    pub fn period_us(&self) -> u64 {
        self.period_us
    }

    /// Bucket capacity: the most tokens that can be spent at once.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Tokens per second, as a float (for sizing heuristics and reports).
    pub fn per_second_f64(&self) -> f64 {
        self.rate as f64 * 1e6 / self.period_us as f64
    }

    /// Fixed-point units per token: `period_us / gcd(rate, period_us)`.
    pub(crate) fn scale(&self) -> u64 {
        self.period_us / gcd(self.rate, self.period_us)
    }

    /// Fixed-point units added per microsecond: `rate / gcd(rate, period_us)`.
    pub(crate) fn increment(&self) -> u64 {
        self.rate / gcd(self.rate, self.period_us)
    }

    /// How long the bucket takes to earn `tokens` tokens (rounded up to the microsecond).
    pub fn time_for(&self, tokens: u64) -> Duration {
        let units = u128::from(tokens) * u128::from(self.scale());
        let us = units.div_ceil(u128::from(self.increment()));
        Duration::from_micros(u64::try_from(us).unwrap_or(u64::MAX))
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_zeroes() {
        assert_eq!(Quota::per_second(0), Err(QuotaError::ZeroRate));
        assert_eq!(Quota::new(1, Duration::ZERO), Err(QuotaError::ZeroPeriod));
        assert_eq!(
            Quota::new(1, Duration::from_nanos(10)),
            Err(QuotaError::ZeroPeriod)
        );
        assert_eq!(
            Quota::per_second(5).unwrap().with_burst(0),
            Err(QuotaError::ZeroBurst)
        );
    }

    #[test]
    fn rejects_sub_microsecond_and_huge_values() {
        assert!(matches!(
            Quota::new(1, Duration::from_nanos(1_500)),
            Err(QuotaError::SubMicrosecondPeriod(_))
        ));
        assert!(matches!(
            Quota::per_second(u64::MAX),
            Err(QuotaError::TooLarge(_))
        ));
        assert!(matches!(
            Quota::new(1, Duration::from_secs(u64::MAX)),
            Err(QuotaError::TooLarge(_))
        ));
        // 1 token per day with a burst of 10^9: 8.64e10 units per token × 1e9 overflows 2^52.
        let err = Quota::with_parts(1, Duration::from_secs(86_400), 1_000_000_000).unwrap_err();
        assert_eq!(
            err,
            QuotaError::BurstTooLarge {
                rate: 1,
                period: Duration::from_secs(86_400),
                burst: 1_000_000_000,
                max_burst: MAX_VALUE / 86_400_000_000,
            }
        );
        // The message names the quota and the largest burst, not the fixed-point arithmetic.
        assert_eq!(
            err.to_string(),
            "burst 1000000000 is too large for 1 tokens per 86400s: at most 52124 with this \
             rate and period (a rate that divides the period evenly allows more; a quota's \
             burst is its rate unless set with `with_burst`)"
        );
        // Just below the bound is fine.
        assert!(Quota::with_parts(1, Duration::from_secs(86_400), 52_124).is_ok());
        assert!(Quota::with_parts(1, Duration::from_secs(86_400), 52_125).is_err());
    }

    #[test]
    fn gcd_keeps_large_quotas_representable() {
        // 10 million per day: scale = 8640 units per token, far below the limit.
        let q = Quota::with_parts(10_000_000, Duration::from_secs(86_400), 10_000_000).unwrap();
        assert_eq!(q.scale(), 8_640);
        assert_eq!(q.increment(), 1);
    }

    #[test]
    fn hours_and_days() {
        let h = Quota::per_hour(3_600).unwrap();
        assert_eq!(
            (h.rate(), h.period(), h.burst()),
            (3_600, Duration::from_secs(3_600), 3_600)
        );
        assert_eq!(h.time_for(1), Duration::from_secs(1));
        let d = Quota::per_day(24).unwrap();
        assert_eq!(d.period(), Duration::from_secs(86_400));
        assert_eq!(d.time_for(1), Duration::from_secs(3_600));
        assert_eq!(Quota::per_day(0), Err(QuotaError::ZeroRate));
        // As its docs say: a rate prime to the day's microseconds allows a burst of 52 124.
        assert!(matches!(
            Quota::per_day(60_001),
            Err(QuotaError::BurstTooLarge {
                max_burst: 52_124,
                ..
            })
        ));
        assert!(Quota::per_day(60_000).is_ok());
    }

    #[test]
    fn time_for_rounds_up() {
        let q = Quota::new(3, Duration::from_micros(10)).unwrap();
        assert_eq!(q.time_for(1), Duration::from_micros(4)); // 10/3 µs per token
        assert_eq!(q.time_for(3), Duration::from_micros(10));
    }
}
