//! The rate-limit response headers: `Retry-After` (RFC 9110) and the IETF httpapi working
//! group's `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers).
//!
//! ```text
//! RateLimit-Policy: "default";q=100;w=60     100 requests per 60 s
//! RateLimit: "default";r=0;t=12              none left; the quota comes back in 12 s
//! Retry-After: 12
//! ```
//!
//! The policy describes the quota's rate in requests (`q` per `w` seconds): the quota's rate
//! divided by the tokens a request costs. A whole number of requests per a period of whole
//! seconds is stated as configured; any other rate in lowest terms (1 per 1.5 s is `q=2;w=3`),
//! or, where those terms would span more than a day, per the period rounded up to whole
//! seconds, requests rounded down (a client within it stays within the limit). The value is
//! built once per layer, for the quota the limiter had then; a stored config that differs
//! (see [`Limiter::quota`](crate::Limiter::quota)) is stated as it is, formatted per response.
//! A refusal formats its two numbers. A limited request's `RateLimit` always says `r=0`: in
//! hybrid mode the fleet's remaining budget lives in the store, and this process's local share
//! of it would mislead a client, so admitted requests carry no `RateLimit` field.

use std::time::Duration;

use http::header::{HeaderName, HeaderValue};

use crate::quota::Quota;

/// `RateLimit-Policy`.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The longest policy name: the headers stay short, and a name is an identifier.
pub const MAX_POLICY_NAME: usize = 64;

/// A policy name that cannot go in a `RateLimit` header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "rate-limit policy name {0:?} must be 1 to 64 characters of letters, digits and -_.:/ \
     (it is sent as a structured-field string)"
)]
pub struct InvalidPolicyName(pub String);

/// Under `?` into the umbrella [`Error`](crate::Error): its
/// [`Config`](crate::Error::Config), this error's text its message.
impl From<InvalidPolicyName> for crate::Error {
    fn from(e: InvalidPolicyName) -> Self {
        crate::Error::Config(e.to_string())
    }
}

/// A named policy's header values.
#[derive(Debug, Clone)]
pub(crate) struct PolicyHeaders {
    /// `"name"` quoted, as both fields start.
    quoted: String,
    /// The tokens a request costs.
    tokens: u64,
    /// The quota `policy` states.
    quota: Quota,
    /// The `RateLimit-Policy` value for `quota`.
    policy: HeaderValue,
}

impl PolicyHeaders {
    /// The headers of policy `name` for `quota`, each request costing `tokens` (0 is read
    /// as 1).
    pub(crate) fn new(name: &str, quota: &Quota, tokens: u64) -> Result<Self, InvalidPolicyName> {
        let valid = !name.is_empty()
            && name.len() <= MAX_POLICY_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b));
        if !valid {
            return Err(InvalidPolicyName(name.to_owned()));
        }
        let quoted = format!("\"{name}\"");
        let tokens = tokens.max(1);
        let policy = policy_value(&quoted, quota, tokens);
        Ok(PolicyHeaders {
            quoted,
            tokens,
            quota: *quota,
            policy,
        })
    }

    /// The same policy, each request costing `tokens`.
    pub(crate) fn with_tokens(&self, tokens: u64) -> Self {
        let tokens = tokens.max(1);
        PolicyHeaders {
            tokens,
            policy: policy_value(&self.quoted, &self.quota, tokens),
            ..self.clone()
        }
    }

    /// The `RateLimit-Policy` value under `quota`, the limiter's now: the value built for it,
    /// or (a stored config that differs) a new one.
    pub(crate) fn policy(&self, quota: &Quota) -> HeaderValue {
        if *quota == self.quota {
            self.policy.clone()
        } else {
            policy_value(&self.quoted, quota, self.tokens)
        }
    }

    /// The `RateLimit` value of a refusal: nothing left, back in `retry_after`.
    pub(crate) fn exhausted(&self, retry_after: Duration) -> HeaderValue {
        let value = format!("{};r=0;t={}", self.quoted, retry_after_secs(retry_after));
        // Only the validated name, digits and `;=`: always a valid header value.
        HeaderValue::try_from(value).unwrap_or_else(|_| HeaderValue::from_static("r=0"))
    }
}

/// `"name";q=…;w=…` for `quota` at `tokens` a request.
fn policy_value(quoted: &str, quota: &Quota, tokens: u64) -> HeaderValue {
    let (q, w) = quota_window(quota, tokens);
    // Only the validated name, digits and `;=`: always a valid header value.
    HeaderValue::try_from(format!("{quoted};q={q};w={w}"))
        .unwrap_or_else(|_| HeaderValue::from_static("q=0"))
}

/// The longest window a policy is stated over in lowest terms, seconds (a day).
const MAX_WINDOW_S: u128 = 86_400;

/// `(q, w)`: requests of `tokens` each that `quota` allows per `w` seconds (see the module
/// docs).
fn quota_window(quota: &Quota, tokens: u64) -> (u64, u64) {
    const NS: u128 = 1_000_000_000;
    let (rate, tokens) = (u128::from(quota.rate()), u128::from(tokens.max(1)));
    let period = quota.period().as_nanos().max(1);
    let saturate = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
    if period.is_multiple_of(NS) && rate.is_multiple_of(tokens) {
        return (saturate(rate / tokens), saturate(period / NS));
    }
    // Requests per second = rate × 1e9 / (tokens × period ns), in lowest terms. Both factors
    // are below 2^64 and 2^128 / 1e9, so neither product overflows.
    let (num, den) = (rate * NS, tokens.saturating_mul(period));
    let g = gcd(num, den);
    let (q, w) = (num / g, den / g);
    if w <= MAX_WINDOW_S {
        return (saturate(q), saturate(w));
    }
    let w = period.div_ceil(NS);
    (saturate(rate * w * NS / den.max(1)), saturate(w))
}

/// Greatest common divisor (Euclid).
fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

/// Whole seconds, rounded up, at least 1: `Retry-After` has second resolution, and 0 would
/// invite an immediate retry.
pub fn retry_after_secs(d: Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_and_exhausted_values() {
        let per_minute = Quota::per_minute(5).unwrap();
        let h = PolicyHeaders::new("api", &per_minute, 1).unwrap();
        assert_eq!(h.policy(&per_minute), "\"api\";q=5;w=60");
        assert_eq!(
            h.exhausted(Duration::from_millis(11_200)),
            "\"api\";r=0;t=12"
        );
        assert_eq!(h.exhausted(Duration::ZERO), "\"api\";r=0;t=1");
        let fast = Quota::new(3, Duration::from_millis(10)).unwrap();
        let h = PolicyHeaders::new("x", &fast, 1).unwrap();
        assert_eq!(h.policy(&fast), "\"x\";q=300;w=1");
        // A stored config that differs is stated as it is.
        assert_eq!(h.policy(&per_minute), "\"x\";q=5;w=60");
    }

    #[test]
    fn the_policy_counts_requests_in_lowest_terms_never_rounding_a_rate_to_zero() {
        let q = |rate, ms, tokens| {
            let quota = Quota::new(rate, Duration::from_millis(ms)).unwrap();
            quota_window(&quota, tokens)
        };
        // As configured where it is whole requests per whole seconds.
        assert_eq!(q(100, 60_000, 1), (100, 60));
        assert_eq!(q(100, 60_000, 5), (20, 60));
        // Otherwise in lowest terms: 1 per 1.5 s (it was "q=0;w=1"), 3 per 2.5 s, 100 per
        // minute at 3 tokens a request (33⅓ a minute), 7/s at 2.
        assert_eq!(q(1, 1_500, 1), (2, 3));
        assert_eq!(q(3, 2_500, 1), (6, 5));
        assert_eq!(q(100, 60_000, 3), (5, 9));
        assert_eq!(q(7, 1_000, 2), (7, 2));
        // Terms longer than a day: per the period rounded up, requests rounded down.
        let odd = Quota::new(1_000_003, Duration::from_micros(1_000_001)).unwrap();
        assert_eq!(quota_window(&odd, 1), (2_000_003, 2));
        let odd = Quota::new(7, Duration::from_micros(2_000_001)).unwrap();
        assert_eq!(quota_window(&odd, 2), (5, 3));
    }

    #[test]
    fn a_policy_for_tokens_states_requests() {
        let quota = Quota::per_minute(100).unwrap();
        let h = PolicyHeaders::new("api", &quota, 1).unwrap().with_tokens(5);
        assert_eq!(h.policy(&quota), "\"api\";q=20;w=60");
    }

    #[test]
    fn bad_names_are_refused() {
        let q = Quota::per_second(1).unwrap();
        for bad in ["", "a\"b", "with space", "é", &"n".repeat(65)] {
            assert_eq!(
                PolicyHeaders::new(bad, &q, 1).unwrap_err(),
                InvalidPolicyName(bad.to_owned())
            );
        }
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2001)), 3);
    }
}
