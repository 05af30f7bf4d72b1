//! Limiters defined in a TOML file (crate feature `toml`), so a service can load them at start.
//!
//! # Design
//!
//! A file has optional `[defaults]` and one table per limiter: `[limiters.<name>]` for a
//! single budget ([`HybridLimiter`](crate::HybridLimiter) / [`RedisLimiter`](crate::RedisLimiter)), `[keyed.<name>]` for one budget per
//! key ([`KeyedHybridLimiter`](crate::KeyedHybridLimiter) / [`KeyedRedisLimiter`](crate::KeyedRedisLimiter)) and `[concurrency.<name>]` for a
//! fleet-wide number of permits ([`ConcurrencyLimiter`](crate::ConcurrencyLimiter)). Every key of `[defaults]` may also be
//! set per limiter, which wins. Parsing checks everything a builder would refuse — names,
//! quotas, lease settings, limits — so a file that loads builds, and a bad file is a
//! [`ConfigFileError`] naming the limiter and the field, never a panic:
//!
//! ```toml
//! [defaults]
//! mode = "hybrid"                     # "hybrid" (default) or "pure"
//! on_store_failure = "local-fallback" # "fail-open", "fail-closed", "local-fallback",
//!                                     # "last-known-share" (default)
//! expected_nodes = 10                 # the fleet size: local-fallback's share, and
//!                                     # last-known-share's until it knows one (default 1)
//! unconfigured = "use-quota"          # "use-quota" (default), "unlimited", "error"
//! budget = "overall"                  # "overall" (default) or "per-client"
//! prefetch = true                     # lease the first batch when built (default); false:
//!                                     # on first demand, for fleets of thousands that
//!                                     # start together (see HybridBuilder::prefetch)
//!
//! [limiters.partner-api]
//! rate = 1000        # tokens per period
//! period = "1s"      # humantime: "250ms", "1m", "1h 30m"; default "1s"
//! burst = 100        # default: rate
//! horizon = "25ms"   # adaptive leasing (the default policy): how long a lease lasts,
//!                    # at most half of burst / rate (the time the burst takes to fill),
//!                    # never cut below 10ms
//!
//! [limiters.sms]
//! rate = 1
//! period = "30m"
//! mode = "pure"
//! algorithm = "sliding-window" # "token-bucket" (default), "fixed-window", "sliding-window",
//!                              # "leaky-bucket" (see `Algorithm`)
//!
//! [limiters.search]
//! rate = 200
//! lease_size = 20    # fixed batches instead of adaptive leasing
//!
//! [keyed.per-user]   # one budget per key, every key with this quota (token bucket)
//! rate = 5
//! period = "1m"
//! max_keys = 100000        # keys held in memory at most (default 100000)
//! idle_ttl = "2m"          # evict a key unused this long (default: fill time + 10s; >= 200ms)
//! give_back_after = "1s"   # return unused tokens after (default: the policy's, else 500ms)
//! max_in_flight = 32       # store calls in flight at once (default 32)
//!
//! [concurrency.exports]
//! limit = 20         # permits held across the fleet at once
//! ttl = "10s"        # a crashed process's permits come back this long after (default 10s)
//! batch = 4          # hybrid: lease 4 slots per store call (default: pure mode, no batch)
//! idle_return = "100ms" # hybrid: give leased slots nobody uses back after (default 100ms)
//! ```
//!
//! [`LimitersConfig::build`] turns a file into running limiters on one store, looked up by
//! name in the [`Limiters`]: [`AnyLimiter`]s (hybrid or pure, both [`Limiter`](crate::Limiter)s),
//! [`AnyKeyedLimiter`]s (both [`KeyedLimiter`](crate::KeyedLimiter)s) and [`ConcurrencyLimiter`](crate::ConcurrencyLimiter)s. Or take one
//! spec — [`LimiterSpec`], [`KeyedSpec`], [`ConcurrencySpec`] — and call its builder method
//! ([`LimiterSpec::hybrid`], [`KeyedSpec::hybrid`], [`ConcurrencySpec::builder`], …) to add
//! settings the file does not cover (a seed, a runtime, a custom [`LeasePolicy`], a hasher).
//!
//! ## Choices
//!
//! - **Names are unique across the three kinds.** A name defined in two kinds is
//!   [`ConfigFileError::Invalid`]: errors, metrics and lookups name a limiter by its name
//!   alone, and a service reading `sms` should not have to ask which `sms`. (The store would
//!   keep them apart — keyed buckets are `name#key`, concurrency records `{name}:conc` — so
//!   this is for people, not for Redis.)
//! - **`[defaults]` applies where the key means something, and is ignored elsewhere.**
//!   `on_store_failure` and `expected_nodes` apply to every kind, but pure keyed limiters
//!   keep no per-key state for a local rate: they take only `"fail-open"` or
//!   `"fail-closed"`, from their own table or `[defaults]`, and skip `[defaults]`' local-rate
//!   policies and `expected_nodes` (without a policy they take, their calls return the
//!   store's error while Redis is failing). `mode`, `horizon` and `lease_size` apply to
//!   plain and keyed limiters. `algorithm`, `unconfigured`, `budget` and `prefetch` apply to
//!   plain limiters only: keyed limiters are token buckets under their own quota, and lease
//!   per key when a key is first seen.
//!   A concurrency limiter ignores `[defaults]`' `mode`, `horizon` and `lease_size`: its
//!   hybrid mode needs a `batch` and trades fairness for speed, so it is chosen per table.
//!   Ignoring (rather than rejecting) lets one `[defaults]` serve a file with every kind; a
//!   key that does not apply to a kind is still a [`ConfigFileError::Parse`] error in that
//!   kind's own table (`deny_unknown_fields`), as is any misspelt key.
//! - **Settings of hybrid mode in a pure limiter's table are refused**, not ignored: a table
//!   that sets `lease_size`, `horizon`, `prefetch`, `max_keys`, `idle_ttl`, `give_back_after`,
//!   `max_in_flight`, `batch` or `idle_return` on a pure limiter asks for something it would
//!   not get; so does a local-rate `on_store_failure` or `expected_nodes` on a pure keyed
//!   limiter, and `expected_nodes` in any table whose failure policy keeps no local rate to
//!   size (fail open or closed, or a pure limiter with no policy named). Such keys in
//!   `[defaults]` are skipped for pure limiters.
//! - **Values a builder would quietly raise are refused**: `max_keys = 0`,
//!   `max_in_flight = 0`, an `idle_ttl` under 200 ms — the file would say one thing and the
//!   limiter do another.
//! - **A concurrency limiter's mode follows `batch`**: `batch = n` makes it hybrid, no batch
//!   pure; `mode = "hybrid"` without a batch, or `mode = "pure"` with one, is refused.
//! - **Keyed limiters are generic over their key type `K`**, which a file cannot name.
//!   [`LimitersConfig::build`] builds them with `String` keys (which take `&str` lookups and,
//!   since buckets are named by a key's `Display` form, share budgets with any other key type
//!   that prints alike); [`LimitersConfig::build_with_keys`] picks another `K` for all of
//!   them, and [`KeyedSpec::build`] builds one with its own `K`.
//!
//! # Where things are
//!
//! The file's path through the code: `raw.rs` (the tables serde reads, and the field checks
//! every kind shares) → `spec.rs` (one checked definition per limiter) → `built.rs` (the
//! limiters, and the enums that hold either mode). This file loads and resolves the whole file.
//!
//! [`LeasePolicy`]: crate::LeasePolicy

mod built;
mod raw;
mod spec;

pub use built::{AnyKeyedLimiter, AnyLimiter, Limiters};
use raw::{invalid, Defaults, File};
pub use spec::{ConcurrencySpec, KeyedSpec, LimiterSpec};

use std::collections::BTreeMap;
use std::fmt::Display;
use std::hash::Hash;
use std::path::Path;

use serde::Deserialize;

use crate::concurrency::ConcurrencyStore;
use crate::error::BuildError;
use crate::store::LeaseStore;

/// Why a limiters file could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigFileError {
    /// The file could not be read. The message says why (`cannot read limiters.toml: No
    /// such file or directory`), so the I/O error is not also its `source`: a report of the
    /// chain says it once.
    #[error("cannot read {path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// The file is not valid TOML, or has an unknown key or a value of the wrong type.
    #[error("invalid limiters file {0}")]
    Parse(ParseError),
    /// A limiter's settings are invalid (of any kind: plain, keyed or concurrency).
    #[error("{}limiter {limiter:?}: {reason}", in_file(.path))]
    Invalid {
        /// The limiter's name.
        limiter: String,
        /// What is wrong.
        reason: String,
        /// The file, if it came from [`LimitersConfig::load`].
        path: Option<String>,
    },
}

/// Under `?` into the umbrella [`Error`](crate::Error): its
/// [`Config`](crate::Error::Config), this error's text its message (the file's path and
/// line, the limiter and the key: everything the text says). The I/O error of
/// [`Io`](ConfigFileError::Io) is not kept, as its text is.
impl From<ConfigFileError> for crate::Error {
    fn from(e: ConfigFileError) -> Self {
        crate::Error::Config(e.to_string())
    }
}

/// `"<path>: "` for an error about a file, nothing for text.
fn in_file(path: &Option<String>) -> String {
    path.as_ref().map(|p| format!("{p}: ")).unwrap_or_default()
}

/// Where and why a limiters file does not parse: one line (`limiters.toml:4:1: unknown field
/// `rat`, expected one of …`), and a `Debug` that holds only that, never the file.
///
/// The position is the offending key's line for a misspelt or misplaced key (the TOML parser
/// itself points at the key's table), else the parser's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    path: Option<String>,
    line: usize,
    column: usize,
    /// The table the parser blamed as a whole (`limiters.a`), when it did.
    table: Option<String>,
    /// The key set on the offending line, if the message does not name it already.
    key: Option<String>,
    message: String,
}

impl ParseError {
    /// The parser's error located in `text` (read from `path`, if a file).
    fn new(error: &toml::de::Error, text: &str, path: Option<&Path>) -> Self {
        // One line: the parser's message may span several.
        let message = error
            .message()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let span_at = error.span().map_or(0, |span| span.start).min(text.len());
        // A table's keys are read into one structure, so the parser blames the whole table
        // for a bad key or value in it: name the table, and find the line if the message
        // says which key or value it is. (Blamed, the span starts the header's line: a `[`
        // after a key's `=` is an array, not a table.)
        let line_start = text[..span_at].rfind('\n').map_or(0, |i| i + 1);
        let headed = text[span_at..]
            .lines()
            .next()
            .filter(|_| text[line_start..span_at].trim().is_empty())
            .and_then(header)
            .map(str::to_owned);
        // An inline table (`api = { … }` under `[limiters]`) is blamed at its `{`: it is the
        // table its path names, on that one line.
        let inline = headed
            .is_none()
            .then(|| inline_table(text, line_start, span_at))
            .flatten();
        let message = with_accepted_keys(message, headed.as_deref().or(inline.as_deref()));
        let at = match headed {
            Some(_) => offending_line(&message, text, span_at).unwrap_or(span_at),
            None => span_at,
        };
        // An inline table's line sets the table's key, not the offending one.
        let on_own_line = inline.is_none();
        let table = headed.or(inline);
        let before = &text[..at];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        let start = before.rfind('\n').map_or(0, |i| i + 1);
        let key = text[start..]
            .lines()
            .next()
            .filter(|_| on_own_line)
            .and_then(|l| l.split_once('='))
            .map(|(k, _)| k.trim().trim_matches(['"', '\'']).to_owned())
            .filter(|k| bare_key(k) && !message.contains(&format!("`{k}`")));
        ParseError {
            path: path.map(|p| p.display().to_string()),
            line,
            column,
            table,
            key,
            message,
        }
    }

    /// The file, if the error came from [`LimitersConfig::load`].
    pub fn path(&self) -> Option<&str> {
        self.path.as_deref()
    }

    /// The line of the error, from 1.
    pub fn line(&self) -> usize {
        self.line
    }

    /// The column of the error, in characters from 1.
    pub fn column(&self) -> usize {
        self.column
    }

    /// The table the error is in (`limiters.a`), where the parser blamed the whole table.
    pub fn table(&self) -> Option<&str> {
        self.table.as_deref()
    }

    /// The key set on the offending line, when the message does not name it.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// What is wrong, as the TOML parser says it (an unknown key's message lists the keys its
    /// table takes).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (line, column) = (self.line, self.column);
        match &self.path {
            Some(path) => write!(f, "{path}:{line}:{column}: ")?,
            None => write!(f, "at line {line}, column {column}: ")?,
        }
        if let Some(table) = &self.table {
            write!(f, "[{table}] ")?;
        }
        if let Some(key) = &self.key {
            write!(f, "`{key}`: ")?;
        }
        f.write_str(&self.message)
    }
}

/// `message` with the keys `table` takes, if it is serde's "unknown field" without them (as
/// for the tables that flatten their shared keys: [`raw::accepted_keys`]), in serde's own
/// words for the tables it lists.
fn with_accepted_keys(message: String, table: Option<&str>) -> String {
    let unlisted = message.starts_with("unknown field `") && !message.contains(", expected");
    match table.and_then(raw::accepted_keys) {
        Some(keys) if unlisted => {
            let keys: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
            format!("{message}, expected one of {}", keys.join(", "))
        }
        _ => message,
    }
}

/// Whether `k` is a TOML bare key (letters, digits, `_` and `-`; not empty).
fn bare_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
}

/// The name of the table a `[table]` header line opens (`limiters.a`); `None` for any other
/// line, an array of tables' `[[…]]` included.
fn header(line: &str) -> Option<&str> {
    let line = line.trim();
    if line.starts_with("[[") {
        return None;
    }
    Some(line.strip_prefix('[')?.split(']').next()?.trim())
}

/// The path of the inline table that starts at `at` (its line starting at `line_start`): the
/// bare key before its `=`, under the nearest table header above it if any (`limiters.api`
/// for `api = { … }` under `[limiters]`, or for `limiters.api = { … }` alone). `None` if no
/// inline table starts there, for a quoted key, an inline table inside another, or one
/// under an array of tables.
fn inline_table(text: &str, line_start: usize, at: usize) -> Option<String> {
    if !text[at..].starts_with('{') {
        return None;
    }
    let key = text[line_start..at].trim_end().strip_suffix('=')?.trim();
    let key: Vec<&str> = key.split('.').map(str::trim).collect();
    if !key.iter().all(|k| bare_key(k)) {
        return None;
    }
    let above = text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['));
    let under = match above {
        Some(line) => Some(header(line)?),
        None => None,
    };
    Some(under.into_iter().chain(key).collect::<Vec<_>>().join("."))
}

/// For an error reported at the table starting at `table`: the offset of the line it is
/// about, if the message says and one line of the table matches — for "unknown field `key`"
/// the line that sets `key`; for "unknown variant `value`" the line that sets a key to
/// `"value"`; for a value of the wrong type or out of range (`invalid type: string "10"`,
/// `invalid value: integer `-1``, as the keys every kind of table shares are reported) the
/// line that sets a key to it (not a comment; if two lines do, neither: the table is blamed).
fn offending_line(message: &str, text: &str, table: usize) -> Option<usize> {
    let quoted = |v: &str| vec![format!("\"{v}\""), format!("'{v}'")];
    let (key, values) = if let Some(rest) = message.strip_prefix("unknown field `") {
        (Some(rest.split('`').next()?), Vec::new())
    } else if let Some(rest) = message.strip_prefix("unknown variant `") {
        (None, quoted(rest.split('`').next()?))
    } else if let Some(rest) = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))
    {
        match rest.strip_prefix("string \"") {
            Some(string) => (None, quoted(string.split('"').next()?)),
            // `integer `-1``, `floating point `1.5``, `boolean `true``: written bare.
            None => (None, vec![rest.split('`').nth(1)?.to_owned()]),
        }
    } else {
        return None;
    };
    let mut offset = text.get(..table)?.rfind('\n').map_or(0, |i| i + 1);
    let mut found_at = None;
    for (i, line) in text[offset..].split_inclusive('\n').enumerate() {
        let trimmed = line.trim_start();
        // The next table header ends the search (the table's own header is line 0).
        if i > 0 && trimmed.starts_with('[') {
            break;
        }
        if trimmed.starts_with('#') {
            offset += line.len();
            continue;
        }
        let found = match key {
            Some(key) => [key.to_owned(), format!("\"{key}\""), format!("'{key}'")]
                .iter()
                .find_map(|k| trimmed.strip_prefix(k.as_str()))
                .is_some_and(|r| r.trim_start().starts_with('=')),
            None => trimmed.split_once('=').is_some_and(|(_, v)| {
                let v = v.split('#').next().unwrap_or("").trim();
                values.iter().any(|value| v == value)
            }),
        };
        if found {
            if found_at.is_some() {
                return None;
            }
            found_at = Some(offset + line.len() - trimmed.len());
        }
        offset += line.len();
    }
    found_at
}

/// How a limiter decides: leasing batches, or one store call per decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Mode {
    /// [`HybridLimiter`](crate::HybridLimiter) or [`KeyedHybridLimiter`](crate::KeyedHybridLimiter) (the default); for a concurrency limiter,
    /// [`ConcurrencyMode::Hybrid`](crate::ConcurrencyMode::Hybrid).
    #[default]
    Hybrid,
    /// [`RedisLimiter`](crate::RedisLimiter) or [`KeyedRedisLimiter`](crate::KeyedRedisLimiter); for a concurrency limiter,
    /// [`ConcurrencyMode::Pure`](crate::ConcurrencyMode::Pure).
    Pure,
}

/// A parsed, checked limiters file.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitersConfig {
    specs: BTreeMap<String, LimiterSpec>,
    keyed: BTreeMap<String, KeyedSpec>,
    concurrency: BTreeMap<String, ConcurrencySpec>,
}

/// Resolves every table of one kind.
fn resolve_all<T, Spec>(
    tables: &BTreeMap<String, T>,
    defaults: &Defaults,
    resolve: impl Fn(&str, &T, &Defaults) -> Result<Spec, ConfigFileError>,
) -> Result<BTreeMap<String, Spec>, ConfigFileError> {
    tables
        .iter()
        .map(|(name, table)| resolve(name, table, defaults).map(|s| (name.clone(), s)))
        .collect()
}

impl LimitersConfig {
    /// Parses a limiters file.
    ///
    /// # Errors
    /// [`ConfigFileError::Parse`] for bad TOML, unknown keys or wrongly typed values;
    /// [`ConfigFileError::Invalid`] for settings a builder would refuse, and for a name
    /// defined in two kinds of table.
    pub fn from_toml(text: &str) -> Result<Self, ConfigFileError> {
        Self::parse(text, None)
    }

    fn parse(text: &str, path: Option<&Path>) -> Result<Self, ConfigFileError> {
        Self::resolve(text, path).map_err(|e| match e {
            ConfigFileError::Invalid {
                limiter, reason, ..
            } => ConfigFileError::Invalid {
                limiter,
                reason,
                path: path.map(|p| p.display().to_string()),
            },
            other => other,
        })
    }

    /// [`parse`](Self::parse), its `Invalid` errors not yet naming the file.
    fn resolve(text: &str, path: Option<&Path>) -> Result<Self, ConfigFileError> {
        let file: File = toml::from_str(text)
            .map_err(|e| ConfigFileError::Parse(ParseError::new(&e, text, path)))?;
        let kinds = [
            ("limiters", file.limiters.keys().collect::<Vec<_>>()),
            ("keyed", file.keyed.keys().collect()),
            ("concurrency", file.concurrency.keys().collect()),
        ];
        let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
        for (kind, names) in &kinds {
            for name in names {
                if let Some(first) = seen.insert(name.as_str(), kind) {
                    return Err(invalid(name)(format!(
                        "defined as both [{first}.{name}] and [{kind}.{name}]; \
                         names are unique across kinds"
                    )));
                }
            }
        }
        Ok(LimitersConfig {
            specs: resolve_all(&file.limiters, &file.defaults, LimiterSpec::resolve)?,
            keyed: resolve_all(&file.keyed, &file.defaults, KeyedSpec::resolve)?,
            concurrency: resolve_all(&file.concurrency, &file.defaults, ConcurrencySpec::resolve)?,
        })
    }

    /// Reads and parses a limiters file.
    ///
    /// # Errors
    /// [`ConfigFileError::Io`] if it cannot be read, else as [`from_toml`](Self::from_toml).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigFileError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|error| ConfigFileError::Io {
            path: path.display().to_string(),
            error,
        })?;
        Self::parse(&text, Some(path))
    }

    /// The limiter called `name` (a `[limiters.<name>]` table), if the file defines it.
    pub fn get(&self, name: &str) -> Option<&LimiterSpec> {
        self.specs.get(name)
    }

    /// Every `[limiters.*]` limiter, by name.
    pub fn iter(&self) -> impl Iterator<Item = &LimiterSpec> {
        self.specs.values()
    }

    /// The keyed limiter called `name` (a `[keyed.<name>]` table), if the file defines it.
    pub fn keyed(&self, name: &str) -> Option<&KeyedSpec> {
        self.keyed.get(name)
    }

    /// Every keyed limiter, by name.
    pub fn iter_keyed(&self) -> impl Iterator<Item = &KeyedSpec> {
        self.keyed.values()
    }

    /// The concurrency limiter called `name` (a `[concurrency.<name>]` table), if the file
    /// defines it.
    pub fn concurrency(&self, name: &str) -> Option<&ConcurrencySpec> {
        self.concurrency.get(name)
    }

    /// Every concurrency limiter, by name.
    pub fn iter_concurrency(&self) -> impl Iterator<Item = &ConcurrencySpec> {
        self.concurrency.values()
    }

    /// How many limiters the file defines, of every kind.
    pub fn len(&self) -> usize {
        self.specs.len() + self.keyed.len() + self.concurrency.len()
    }

    /// True when the file defines none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Builds every limiter on `store` (cloned for each), keyed ones with `String` keys. The
    /// store serves concurrency limits too ([`ConcurrencyStore`]: [`RedisStore`] and
    /// [`MemoryStore`] do), whether or not the file has any.
    ///
    /// [`RedisStore`]: crate::RedisStore
    /// [`MemoryStore`]: crate::MemoryStore
    ///
    /// # Errors
    /// As [`LimiterSpec::build`], [`KeyedSpec::build`] and [`ConcurrencySpec::build`]: a
    /// tokio runtime is needed for hybrid and concurrency limiters.
    pub fn build<S>(&self, store: &S) -> Result<Limiters<S>, BuildError>
    where
        S: LeaseStore + ConcurrencyStore + Clone,
    {
        self.build_with_keys(store)
    }

    /// As [`build`](Self::build), with keyed limiters keyed by `K`. (For keyed limiters of
    /// different key types, build each from its [`KeyedSpec`].)
    ///
    /// # Errors
    /// As [`build`](Self::build).
    pub fn build_with_keys<K, S>(&self, store: &S) -> Result<Limiters<S, K>, BuildError>
    where
        K: Hash + Eq + Clone + Display + Send + Sync + 'static,
        S: LeaseStore + ConcurrencyStore + Clone,
    {
        let limiters = self
            .specs
            .iter()
            .map(|(name, spec)| Ok((name.clone(), spec.build(store.clone())?)))
            .collect::<Result<_, BuildError>>()?;
        let keyed = self
            .keyed
            .iter()
            .map(|(name, spec)| Ok((name.clone(), spec.build(store.clone())?)))
            .collect::<Result<_, BuildError>>()?;
        let concurrency = self
            .concurrency
            .iter()
            .map(|(name, spec)| Ok((name.clone(), spec.build(store.clone())?)))
            .collect::<Result<_, BuildError>>()?;
        Ok(Limiters {
            limiters,
            keyed,
            concurrency,
        })
    }
}
