//! How a keyed limiter's key becomes the name of a bucket in the store.
//!
//! The bucket of key `k` in keyed limiter `name` is the plain limiter name `name#<k>`, where
//! `<k>` is the key's `Display` form with `%` and `#` percent-encoded (`%25`, `%23`). The store
//! then builds its Redis keys from that name as for any limiter ([`crate::key`]): the whole
//! bucket name is the `{hash tag}`, braces in it are encoded there, so a user-supplied key can
//! neither break the tag nor reach outside the prefix — and different keys of one limiter
//! spread over the slots of a Redis Cluster.
//!
//! - **Unambiguous.** An encoded key contains no bare `#`, so the last `#` of a bucket name
//!   separates limiter name and key: two (name, key) pairs never share a bucket.
//! - **Bounded.** An encoded key longer than [`MAX_KEY_BYTES`] is replaced by `%s` and the
//!   SHA-1 of the key's `Display` form in hex (42 bytes). No encoded key starts with `%s` (a
//!   `%` is always encoded as `%25`), so hashed and verbatim keys never meet. What matters
//!   against hostile keys is second-preimage resistance — nobody can make up a key that shares
//!   the bucket of someone else's long key — which SHA-1 still has (its known attacks make
//!   *pairs* of colliding inputs, which would only let an attacker share a budget with
//!   himself); `sha1_smol` is already in the build through redis-rs.
//! - **Stable.** Every process, in any language, derives the same name: the fleet shares one
//!   bucket per key. A plain [`RedisLimiter`](crate::RedisLimiter) or
//!   [`HybridLimiter`](crate::HybridLimiter) built on the bucket name shares that key's budget,
//!   and a central config stored under it ([`ConfigStore`](crate::ConfigStore)) applies to
//!   that key alone.
//!
//! Keys are compared by their `Display` form: two keys that print alike share a budget.

use std::fmt::{Display, Write};

use crate::error::BuildError;
use crate::key::{validate_name, MAX_NAME_LEN};

/// Longest encoded key kept verbatim in a bucket name, in bytes; longer keys are hashed.
pub const MAX_KEY_BYTES: usize = 128;

/// Longest keyed limiter name, in bytes: every bucket name stays within [`MAX_NAME_LEN`].
pub(crate) const MAX_KEYED_NAME_LEN: usize = MAX_NAME_LEN - MAX_KEY_BYTES - 1;

/// Checks a keyed limiter's name: a valid limiter name short enough for its buckets' names.
pub(crate) fn validate_keyed_name(name: &str) -> Result<(), BuildError> {
    validate_name(name)?;
    if name.len() > MAX_KEYED_NAME_LEN {
        return Err(BuildError::Config(format!(
            "keyed limiter name is {} bytes; at most {MAX_KEYED_NAME_LEN}",
            name.len()
        )));
    }
    Ok(())
}

/// The bucket name of `key` in keyed limiter `name`.
pub(crate) fn bucket_name<Q: Display + ?Sized>(name: &str, key: &Q) -> String {
    let mut raw = String::new();
    // Writing to a String cannot fail (only a broken Display impl could, and then the key
    // is just what it wrote so far).
    let _ = write!(raw, "{key}");
    let mut out = String::with_capacity(name.len() + 1 + raw.len().min(MAX_KEY_BYTES) + 6);
    out.push_str(name);
    out.push('#');
    let start = out.len();
    for c in raw.chars() {
        match c {
            '%' => out.push_str("%25"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
        if out.len() - start > MAX_KEY_BYTES {
            out.truncate(start);
            let _ = write!(out, "%s{}", sha1_smol::Sha1::from(raw.as_bytes()).digest());
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::bucket_key;

    #[test]
    fn keys_are_encoded_and_the_last_separator_splits() {
        assert_eq!(bucket_name("sms", "+4912345"), "sms#+4912345");
        assert_eq!(bucket_name("sms", &42u64), "sms#42");
        assert_eq!(bucket_name("a", "b#c%"), "a#b%23c%25");
        // Limiter `a#b` with key `c` and limiter `a` with key `b#c` are different buckets.
        assert_ne!(bucket_name("a#b", "c"), bucket_name("a", "b#c"));
        assert_ne!(bucket_name("a", "b%23c"), bucket_name("a", "b#c"));
    }

    #[test]
    fn braces_in_keys_stay_inside_the_hash_tag() {
        let k = bucket_key("rl:", &bucket_name("sms", "}x{y"));
        assert_eq!(k, "rl:{sms#%7Dx%7By}");
        let open = k.find('{').unwrap();
        assert_eq!(open + k[open..].find('}').unwrap(), k.len() - 1);
        assert!(k.starts_with("rl:"));
    }

    #[test]
    fn long_keys_are_hashed_to_a_bounded_distinct_name() {
        let fits = "x".repeat(MAX_KEY_BYTES);
        assert_eq!(bucket_name("n", &fits), format!("n#{fits}"));
        let long = "x".repeat(MAX_KEY_BYTES + 1);
        let hashed = bucket_name("n", &long);
        assert!(hashed.starts_with("n#%s"), "{hashed}");
        assert_eq!(hashed.len(), "n#%s".len() + 40);
        assert_ne!(hashed, bucket_name("n", &"x".repeat(MAX_KEY_BYTES + 2)));
        // Encoding can push a short key over the limit: 50 `#` are 150 bytes encoded.
        assert!(bucket_name("n", &"#".repeat(50)).starts_with("n#%s"));
        // A verbatim key that looks like a hash is encoded, so the two cannot meet.
        let lookalike = format!("%s{}", &hashed["n#%s".len()..]);
        assert_ne!(bucket_name("n", &lookalike), hashed);
        // Multi-byte characters are never split.
        let wide = "é".repeat(MAX_KEY_BYTES);
        assert!(bucket_name("n", &wide).starts_with("n#%s"));
    }

    #[test]
    fn every_bucket_name_is_a_valid_limiter_name() {
        let name = "n".repeat(MAX_KEYED_NAME_LEN);
        validate_keyed_name(&name).unwrap();
        validate_name(&bucket_name(&name, &"k".repeat(MAX_KEY_BYTES))).unwrap();
        validate_name(&bucket_name(&name, &"k".repeat(10_000))).unwrap();
        assert!(validate_keyed_name(&format!("{name}n")).is_err());
        assert!(validate_keyed_name("").is_err());
    }
}
