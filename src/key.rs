//! Redis key naming.
//!
//! Every key of one limiter is `<prefix>{<name>}<suffix>`: the braces are a Redis Cluster hash
//! tag, so all keys a script touches hash to one slot. Names are user input, so `{`, `}` and `%`
//! are percent-encoded inside the tag: a name can neither close the tag early nor reach outside
//! the prefix. Prefixes are configuration and may not contain braces at all.

use crate::error::BuildError;

/// Longest limiter name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

/// Checks a limiter name: non-empty, at most [`MAX_NAME_LEN`] bytes.
pub fn validate_name(name: &str) -> Result<(), BuildError> {
    if name.is_empty() {
        return Err(BuildError::Config("limiter name must not be empty".into()));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(BuildError::Config(format!(
            "limiter name is {} bytes; at most {MAX_NAME_LEN}",
            name.len()
        )));
    }
    Ok(())
}

/// Checks a key prefix: no hash-tag braces.
pub fn validate_prefix(prefix: &str) -> Result<(), BuildError> {
    if prefix.contains(['{', '}']) {
        return Err(BuildError::Config(format!(
            "key prefix {prefix:?} must not contain '{{' or '}}': the limiter name is the hash tag"
        )));
    }
    Ok(())
}

/// The bucket key of limiter `name` under `prefix`.
pub fn bucket_key(prefix: &str, name: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + name.len() + 2);
    key.push_str(prefix);
    key.push('{');
    for c in name.chars() {
        match c {
            '%' => key.push_str("%25"),
            '{' => key.push_str("%7B"),
            '}' => key.push_str("%7D"),
            c => key.push(c),
        }
    }
    key.push('}');
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_in_names_stay_inside_the_tag() {
        let k = bucket_key("rl:", "a}b{c%");
        assert_eq!(k, "rl:{a%7Db%7Bc%25}");
        // The hash tag Redis uses is everything between the first '{' and the next '}'.
        let open = k.find('{').unwrap();
        let close = open + k[open..].find('}').unwrap();
        assert_eq!(close, k.len() - 1);
    }

    #[test]
    fn distinct_names_give_distinct_keys() {
        assert_ne!(bucket_key("p:", "a%7D"), bucket_key("p:", "a}"));
    }

    #[test]
    fn rejects_bad_names_and_prefixes() {
        assert!(validate_name("").is_err());
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN + 1)).is_err());
        assert!(validate_prefix("a{b").is_err());
        assert!(validate_prefix("ratelease:").is_ok());
    }
}

/// `url` with its password replaced by `***` (`redis://user:***@host:6379/0`,
/// `redis+unix:///run/redis.sock?pass=***`), for error messages and logs: a URL names the
/// server an error is about, its password must not travel with it. Query parameters `pass`
/// and `password` (where redis-rs reads a unix socket's credentials) are elided. The userinfo
/// is taken to end at the last `@` before the query (at the last `@` of all if none is
/// there), not at the first `/`, `?` or `#` as a parser reads it: a generated password
/// holding one of those unescaped makes the URL invalid, and the error that says so must not
/// print it. Anything without `://` is returned as is.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // The query's credentials first: a password there may hold an '@' too.
    let rest = match rest.split_once('?') {
        Some((head, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((key, _)) if matches!(key, "pass" | "password") => format!("{key}=***"),
                    _ => param.to_owned(),
                })
                .collect();
            format!("{head}?{}", params.join("&"))
        }
        None => rest.to_owned(),
    };
    // The userinfo ends at the last '@' before the query; with none there, at the last '@'
    // at all (a password holding an unescaped '?').
    let before_query = &rest[..rest.find('?').unwrap_or(rest.len())];
    let at = before_query.rfind('@').or_else(|| rest.rfind('@'));
    let Some(at) = at else {
        return format!("{scheme}://{rest}");
    };
    let (userinfo, after) = (&rest[..at], &rest[at + 1..]);
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{after}"),
        None => format!("{scheme}://{rest}"),
    }
}

#[cfg(test)]
mod redact_tests {
    use super::redact_url;

    #[test]
    fn passwords_are_elided_and_the_rest_kept() {
        let cases = [
            ("redis://:secret@h:6379/0", "redis://:***@h:6379/0"),
            ("rediss://u:p@ss@h/", "rediss://u:***@h/"),
            ("redis://user@h/", "redis://user@h/"),
            ("redis://h:6379/?password=x", "redis://h:6379/?password=***"),
            (
                "redis+unix:///run/redis.sock?db=1&pass=hunter2&user=u",
                "redis+unix:///run/redis.sock?db=1&pass=***&user=u",
            ),
            // A password with an unescaped '/', '?' or '#': an invalid URL, whose error
            // names it.
            ("redis://u:ab/cd@h:6379/0", "redis://u:***@h:6379/0"),
            ("redis://:a?b#c@h/", "redis://:***@h/"),
            ("redis://h:6379/0", "redis://h:6379/0"),
            // An '@' in the query: a password there, or another parameter.
            (
                "redis+unix:///run/redis.sock?pass=p@ss",
                "redis+unix:///run/redis.sock?pass=***",
            ),
            (
                "redis://h:6379/0?password=p@ss",
                "redis://h:6379/0?password=***",
            ),
            ("redis://u:pw@h/0?x=a@b", "redis://u:***@h/0?x=a@b"),
            ("not a url", "not a url"),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }
}
