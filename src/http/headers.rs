//! The rate-limit response headers: `Retry-After` (RFC 9110) and the IETF httpapi working
//! group's `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers).
//!
//! ```text
//! RateLimit-Policy: "default";q=100;w=60     100 requests per 60 s
//! RateLimit: "default";r=0;t=12              none left; the quota comes back in 12 s
//! Retry-After: 12
//! ```
//!
//! The policy describes the quota's rate (`q` per `w` seconds). A quota whose period is not a
//! whole number of seconds is stated per second, rounded down. The policy value is built once
//! per layer; a refusal formats its two numbers. A limited request's `RateLimit` always says
//! `r=0`: in hybrid mode the fleet's remaining budget lives in the store, and this process's
//! local share of it would mislead a client, so admitted requests carry no `RateLimit` field.

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

/// A named policy's header values.
#[derive(Debug, Clone)]
pub(crate) struct PolicyHeaders {
    /// `"name"` quoted, as both fields start.
    quoted: String,
    /// The `RateLimit-Policy` value.
    policy: HeaderValue,
}

impl PolicyHeaders {
    /// The headers of policy `name` for `quota`.
    pub(crate) fn new(name: &str, quota: &Quota) -> Result<Self, InvalidPolicyName> {
        let valid = !name.is_empty()
            && name.len() <= MAX_POLICY_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b));
        if !valid {
            return Err(InvalidPolicyName(name.to_owned()));
        }
        let quoted = format!("\"{name}\"");
        let (q, w) = quota_window(quota);
        let policy = HeaderValue::try_from(format!("{quoted};q={q};w={w}"))
            .map_err(|_| InvalidPolicyName(name.to_owned()))?;
        Ok(PolicyHeaders { quoted, policy })
    }

    /// The `RateLimit-Policy` value.
    pub(crate) fn policy(&self) -> HeaderValue {
        self.policy.clone()
    }

    /// The `RateLimit` value of a refusal: nothing left, back in `retry_after`.
    pub(crate) fn exhausted(&self, retry_after: Duration) -> HeaderValue {
        let value = format!("{};r=0;t={}", self.quoted, retry_after_secs(retry_after));
        // Only the validated name, digits and `;=`: always a valid header value.
        HeaderValue::try_from(value).unwrap_or_else(|_| HeaderValue::from_static("r=0"))
    }
}

/// `(q, w)`: the quota's rate per its period in whole seconds, else per second.
fn quota_window(quota: &Quota) -> (u64, u64) {
    let period = quota.period();
    if period.subsec_nanos() == 0 && period.as_secs() > 0 {
        (quota.rate(), period.as_secs())
    } else {
        // f64 -> u64 saturates; the rate is finite and non-negative.
        (quota.per_second_f64().floor() as u64, 1)
    }
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
        let h = PolicyHeaders::new("api", &Quota::per_minute(5).unwrap()).unwrap();
        assert_eq!(h.policy(), "\"api\";q=5;w=60");
        assert_eq!(
            h.exhausted(Duration::from_millis(11_200)),
            "\"api\";r=0;t=12"
        );
        assert_eq!(h.exhausted(Duration::ZERO), "\"api\";r=0;t=1");
        let fast = Quota::new(3, Duration::from_millis(10)).unwrap();
        let h = PolicyHeaders::new("x", &fast).unwrap();
        assert_eq!(h.policy(), "\"x\";q=300;w=1");
    }

    #[test]
    fn bad_names_are_refused() {
        let q = Quota::per_second(1).unwrap();
        for bad in ["", "a\"b", "with space", "é", &"n".repeat(65)] {
            assert_eq!(
                PolicyHeaders::new(bad, &q).unwrap_err(),
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
