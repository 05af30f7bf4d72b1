//! The shared step: a pure function from (stored state, quota, operation, now) to
//! (new state, reply).
//!
//! This is the Rust twin of `lua/token_bucket.lua`, written to give the same reply for every
//! input, error messages included. [`MemoryStore`](crate::MemoryStore) runs it under a per-key
//! lock; the script runs it inside Redis. A differential property test holds the two together.
//! The script's header explains the protocol (conservation, fair shares and claims); this
//! file follows it line by line.
//!
//! # Arithmetic
//!
//! A quota adds `rate` tokens every `period_us` microseconds. With `g = gcd(rate, period_us)`,
//! one token is `scale = period_us / g` units and each microsecond adds `inc = rate / g` units,
//! so a lazy refill is the exact integer `elapsed_us × inc`: no fraction of a token is ever lost
//! (the common `floor(elapsed / interval)` refill drops one on every call). [`Quota`] keeps
//! `burst × scale ≤ 2^52`, so the script's doubles hold every bucket value exactly. Shares and
//! credits are doubles, computed here in the same order of operations as in Lua, so IEEE
//! rounding gives both the same bits.
//!
//! A bucket at capacity with nothing outstanding is not stored: absent means full. Stored state
//! expires [`SLACK_MS`] after it would be full again (or after its last lease expires), so
//! expiry never changes an answer.
//!
//! # Releases a lease accounted for
//!
//! A node takes the tokens it gives back out of what it holds before it sends the release, so
//! its next lease reports them gone ([`NodeLeaseArgs::held`]) and they are counted as spent
//! there. A release the store runs after that lease (delayed, or retried after a timeout)
//! must do nothing, or its tokens would be offered to the fleet again while the node still
//! holds its own (and a leaving release would drop the node's new record). So a node's lease
//! carries the last release seq it has sent ([`NodeLeaseArgs::release_seq`]), the record
//! keeps the larger of it and its own ([`Leaser::release_seq`]; a new record starts from it),
//! and a release whose seq is not above the record's is ignored: the script's "Releases a
//! lease accounted for".

use std::collections::{BTreeMap, BTreeSet};

use crate::quota::{Quota, MAX_VALUE};

/// Milliseconds stored state outlives the time it could matter.
pub const SLACK_MS: u64 = 10_000;

/// Largest explicit `now` (µs) the script accepts: 2^53.
pub const MAX_TIME_US: u64 = 1 << 53;

/// Longest node id, in bytes.
pub const MAX_NODE_LEN: usize = 128;

/// Longest a retry waits beyond the time at the whole rate while rate leases hold part of it:
/// they are renewed smaller, or expire, at any time (right after a start within a few
/// horizons), so a wait computed from the refill they leave now would sleep through it. A node
/// that leases tokens beside rated nodes was told to wait 0.76 s at a fleet start with a bound
/// of a second, holding nothing while the rates it waited on were renewed to their shares.
pub const RESERVED_RETRY_US: u64 = 100_000;

/// The reserve (the lowest tokens of the bucket, handed out only against credit) is half the
/// caller's horizon of the rate, but never more than the burst over this. A horizon stretched
/// for a small share (up to half a ttl) set up to the whole burst aside for that caller, so a
/// node back from idle, whose share is small until its demand is reported, was held to its
/// credit in a bucket that was full: a fleet of 1 000 nodes busy 2 s in 5 with a burst of half
/// a second admitted 0.76 of its budget (SIMULATIONS.md, "A reserve for the fleet, not the
/// caller"). The automatic horizon's reserve (with a fill time of 30 ms or more, a sixth of the
/// burst at most: half of a third of the fill time) is under the cap; a cap of a sixth cost a
/// 1 000-node start's first second 0.006.
pub const RESERVE_PARTS: u64 = 4;

/// How long one drip of a rate lease may cover, µs: a quarter of the node's horizon. A node
/// adds the tokens its rate earned since its last drip, but never for more than this, so
/// between two drips it can run ahead of a continuous bucket by at most one step's tokens.
pub fn drip_step_us(horizon_us: u64) -> u64 {
    horizon_us / 4
}

/// Tokens one drip step of `rate_mtps` earns, rounded up: what a node holding that rate keeps
/// of its counted tokens out of its local bucket, so that a drip's run-ahead stays inside what
/// the store counts for it.
pub fn drip_slack(rate_mtps: u64, step_us: u64) -> u64 {
    (rate_mtps as f64 * step_us as f64 / 1e9).ceil() as u64
}

/// Units per µs left to a bucket under `q` while leasers hold `reserved` millitokens per second
/// of its rate (0 or less: none).
fn unreserved(q: &Quota, reserved: u64) -> f64 {
    q.increment() as f64 - reserved as f64 * q.scale() as f64 / 1e9
}

/// Units a bucket under `q` gains in `dt` µs while leasers hold `reserved` millitokens per
/// second of its rate, at most `room`. With nothing reserved it is exact (`dt × inc`); with a
/// reservation the reserved units are rounded up and the gain down, so the shared bucket never
/// gains more than the rate left to it.
fn gain(q: &Quota, reserved: u64, dt: u64, room: u64) -> u64 {
    let inc = q.increment();
    if reserved == 0 {
        return if dt >= room.div_ceil(inc) {
            room
        } else {
            dt * inc
        };
    }
    let eff = unreserved(q, reserved);
    if eff <= 0.0 {
        return 0;
    }
    if dt as f64 >= (room as f64 / eff).ceil() {
        return room;
    }
    let scale = q.scale() as f64;
    let add = (dt as f64 * inc as f64 - (dt as f64 * reserved as f64 * scale / 1e9).ceil()).floor();
    add.min(room as f64).max(0.0) as u64
}

/// The reserve, whole tokens, for a caller leasing over `horizon_us` under `q`: half that
/// horizon of the rate, at most a quarter of the burst ([`RESERVE_PARTS`]) — bounded for the
/// fleet whatever the caller's horizon, so a horizon stretched for a small share does not set
/// more of the bucket aside. The same for a node and for the anonymous callers (over
/// [`ANON_HORIZON_US`]); the script writes it out in both places, in the same operations.
fn reserve_tokens(q: &Quota, horizon_us: f64) -> u64 {
    ((q.rate() as f64 * horizon_us / q.period_us() as f64 / 2.0).floor())
        .min((q.burst() / RESERVE_PARTS) as f64) as u64
}

/// Microseconds until a bucket under `q` gains `units`, while `reserved` millitokens per
/// second of its rate are held by leasers — but never more than [`RESERVED_RETRY_US`] beyond
/// the time at the whole rate: rate leases may be renewed smaller any time, so a wait computed
/// from what is left now could be far too long.
fn fill_time(q: &Quota, reserved: u64, units: u64) -> u64 {
    let inc = q.increment();
    if reserved == 0 {
        return units.div_ceil(inc);
    }
    if units == 0 {
        return 0;
    }
    let most = units.div_ceil(inc) + RESERVED_RETRY_US;
    let eff = unreserved(q, reserved);
    if eff <= 0.0 {
        return most;
    }
    (units as f64 / eff).ceil().min(most as f64) as u64
}

/// The stored bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketState {
    /// Tokens × `scale` available to lease.
    pub level: u64,
    /// Units per token when this state was written.
    pub scale: u64,
    /// Time of the last update, µs on the store's clock.
    pub ts_us: u64,
    /// Tokens leased to nodes and not yet spent, returned or expired.
    pub outstanding: u64,
    /// Sum of live leasers' demand, millitokens per second.
    pub demand: u64,
    /// The quota this state was written under: rate (0 if unknown, e.g. written by an older
    /// script).
    pub rate: u64,
    /// … its period, µs.
    pub period_us: u64,
    /// … its burst.
    pub burst: u64,
    /// Rate reserved by leasers (rate leases), millitokens per second: the bucket refills at
    /// the quota's rate less this. 0 when no leaser holds a rate (then the state is stored in
    /// the format earlier versions read).
    pub reserved_mtps: u64,
}

/// One leaser's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leaser {
    /// Tokens leased to it and not known to be spent.
    pub outstanding: u64,
    /// Its reported demand, millitokens per second.
    pub demand: u64,
    /// Credit, in units.
    pub credit: u64,
    /// When the credit was last brought up to date, µs.
    pub credit_ts: u64,
    /// When its lease expires, µs.
    pub expires_us: u64,
    /// The highest release sequence number applied, or reported sent by one of its leases
    /// ([`NodeLeaseArgs::release_seq`]): a release at or below it is ignored.
    pub release_seq: u64,
    /// The rate it holds (a rate lease), millitokens per second; 0 if none.
    pub rate_mtps: u64,
}

/// Everything stored for one limiter name: the bucket and its leasers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    /// The bucket; `None` reads as full.
    pub bucket: Option<BucketState>,
    /// Leasers by node id.
    pub leasers: BTreeMap<String, Leaser>,
    /// The same leasers by expiry, then id (the script's sorted set): `(expires_us, id)` for
    /// every entry of `leasers`, so finding the expired ones and the latest expiry does not
    /// scan every leaser.
    pub expiry: BTreeSet<(u64, String)>,
    /// The pending claim, if any (the script keeps it in the leasers hash, under the empty
    /// field name no node can have).
    pub claim: Option<Claim>,
    /// What anonymous calls asked for beside leasers, and their credit (kept beside the
    /// claim), if any.
    pub anonymous: Option<AnonymousDemand>,
}

/// Anonymous callers (pure mode, per-request decisions, other languages' clients) beside
/// leasers: the tokens they asked for, counted per window of [`ANON_WINDOW_US`], and the
/// credit they share. Leasers' shares of the rate are computed among the leasers' demand and
/// this together; the anonymous callers, as one more claimant with that demand, reach the
/// reserve against their credit, as a leaser does (see [`ANON_HORIZON_US`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnonymousDemand {
    /// When the current window began, µs.
    pub since_us: u64,
    /// Tokens asked for in it.
    pub current: u64,
    /// Tokens asked for in the window before (0 if more than one window ago).
    pub previous: u64,
    /// Their credit, in the bucket's units: it accrues at their share of the rate.
    pub credit: u64,
    /// When it last accrued, µs.
    pub credit_ts: u64,
}

/// The horizon anonymous callers are taken to lease at, µs: the longest horizon the
/// automatic policy starts from (a third of the fill time, at most 250 ms; a small share's is
/// stretched beyond it). Beside leasers, an anonymous take sees the
/// level above the reserve such a leaser keeps (half of it at the rate, at most a quarter of
/// the burst), and below it as far as the anonymous callers' credit goes, which accrues at
/// their share and is capped at one such horizon of it. Taking the whole level while leasers
/// reached the reserve only against credit, the anonymous callers were served first: half of
/// a fleet in pure mode beside the other half leasing accepted 0.997 of their requests and
/// the leasers 0.202 (SIMULATIONS.md, "Pure-mode clients beside leasers").
pub const ANON_HORIZON_US: u64 = 250_000;

/// The window anonymous demand is counted over, µs: a count per window × 1 000 is
/// millitokens per second.
pub const ANON_WINDOW_US: u64 = 1_000_000;

impl AnonymousDemand {
    /// Counts `want` tokens asked for at `now`.
    fn count(&mut self, want: u64, now: u64) {
        if now >= self.since_us + ANON_WINDOW_US {
            self.previous = if now < self.since_us + 2 * ANON_WINDOW_US {
                self.current
            } else {
                0
            };
            self.current = 0;
            self.since_us = now;
        }
        self.current = (self.current + want).min(MAX_VALUE);
    }

    /// Tokens per window at `now`: the last whole window's, or this one's if more; none once
    /// two windows have passed without a count.
    fn per_window(&self, now: u64) -> u64 {
        if now < self.since_us + ANON_WINDOW_US {
            self.current.max(self.previous)
        } else if now < self.since_us + 2 * ANON_WINDOW_US {
            self.current
        } else {
            0
        }
    }
}

/// A claim: units of the bucket held back from every other leaser for one node that is due
/// (its credit covers its step) but found the level short, so the refill serves it before the
/// first-come part instead of letting smaller steps take the level first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The claiming node.
    pub node: String,
    /// Units held back for it: its step, in the bucket's units.
    pub units: u64,
    /// When the claim lapses, µs (never after the claimant's lease expires).
    pub until_us: u64,
}

/// A node's lease arguments as the script reads them (hybrid mode; the request a limiter
/// sends is [`crate::NodeLease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeLeaseArgs<'a> {
    /// The node's id.
    pub id: &'a str,
    /// Tokens it still holds unspent.
    pub held: u64,
    /// Its demand, millitokens per second.
    pub demand_mtps: u64,
    /// How long one lease should last, µs.
    pub horizon_us: u64,
    /// How long the lease is valid, µs.
    pub ttl_us: u64,
    /// The rate it asks to hold (a rate lease), millitokens per second; 0 for none.
    pub rate_mtps: u64,
    /// The sequence number of the last release the node has sent (0: none). Its record's
    /// [`Leaser::release_seq`] becomes at least this, so a release the store runs after this
    /// lease — one whose tokens `held` already reported gone — is ignored.
    pub release_seq: u64,
}

/// A node's release arguments as the script reads them (see [`crate::NodeRelease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeReleaseArgs<'a> {
    /// The node's id.
    pub id: &'a str,
    /// Release sequence number (idempotence): applied only above the record's
    /// [`Leaser::release_seq`].
    pub seq: u64,
    /// Whether the node stops leasing.
    pub leaving: bool,
}

/// What one script call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op<'a> {
    /// Take up to `want` tokens, but only if at least `min` are there.
    Lease {
        /// Most tokens to grant.
        want: u64,
        /// Fewest acceptable; below it nothing is taken.
        min: u64,
        /// The leasing node, or `None` for pure mode.
        node: Option<NodeLeaseArgs<'a>>,
    },
    /// Give `tokens` back, never raising the bucket above capacity.
    Release {
        /// Tokens returned.
        tokens: u64,
        /// The releasing node, or `None`.
        node: Option<NodeReleaseArgs<'a>>,
    },
}

/// The script's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepReply {
    /// Tokens taken by this call.
    pub granted: u64,
    /// Whole tokens left.
    pub remaining: u64,
    /// Microseconds until a lease like this one could succeed (0 if it could now); also sent
    /// with a grant, so a node can pace itself.
    pub retry_after_us: u64,
    /// Microseconds until the bucket stops refilling.
    pub reset_after_us: u64,
    /// The node's fair share, millitokens per second (0 for anonymous calls).
    pub share_mtps: u64,
    /// The rate the node now holds (a rate lease), millitokens per second (0 if none, and
    /// for anonymous calls).
    pub rate_mtps: u64,
    /// Claimants of the bucket after this step, for a node's lease only (0 for anonymous
    /// calls and releases): the nodes holding a lease, and the anonymous callers as one more
    /// while they ask (see [`AnonymousDemand`]) — a node that sizes its room in the burst by
    /// the leasers must leave them theirs: two rated nodes of ten sharing a burst of 10, the
    /// eight others deciding per request, took half the burst each and the eight got nothing.
    pub leasers: u64,
    /// The quota the step ran under.
    pub quota: Quota,
    /// Where that quota came from.
    pub source: QuotaSource,
}

/// Rejected arguments; the message is the same text the script returns after `RATELEASE `.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidArgument(pub &'static str);

impl std::fmt::Display for InvalidArgument {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid argument {}", self.0)
    }
}

/// Where the quota a step ran under came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaSource {
    /// The caller's quota: the name has no stored configuration.
    Caller,
    /// The quota stored centrally for the name (see [`ConfigStore`](crate::ConfigStore)).
    Stored,
    /// The name has no stored configuration and the caller asked not to fall back to its own
    /// quota: nothing was done.
    Absent,
}

impl QuotaSource {
    /// The script's code for it (the last reply entry of a 4-key call).
    pub fn code(self) -> u64 {
        match self {
            QuotaSource::Caller => 0,
            QuotaSource::Stored => 1,
            QuotaSource::Absent => 2,
        }
    }

    /// The source with script code `code`.
    pub fn from_code(code: u64) -> Option<Self> {
        match code {
            0 => Some(QuotaSource::Caller),
            1 => Some(QuotaSource::Stored),
            2 => Some(QuotaSource::Absent),
            _ => None,
        }
    }
}

/// Which quota a step runs under: the script's `KEYS[4]` and `ARGV[13]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Effective {
    /// The quota stored for the name, if any.
    pub stored: Option<Quota>,
    /// Without a stored quota: run under the caller's (`true`), or do nothing and answer
    /// [`QuotaSource::Absent`] (`false`).
    pub fallback_to_caller: bool,
}

impl Effective {
    /// No stored configuration; the caller's quota (the 3-key protocol).
    pub const CALLER: Effective = Effective {
        stored: None,
        fallback_to_caller: true,
    };
}

/// Runs one step on `stored` under the caller's `quota` (no central configuration). Returns
/// the reply and how long the state must be kept (`None` when nothing is stored any more). On
/// error nothing is changed.
pub fn step(
    stored: &mut Stored,
    quota: &Quota,
    op: Op<'_>,
    now_us: u64,
) -> Result<(StepReply, Option<u64>), InvalidArgument> {
    step_with(stored, quota, Effective::CALLER, op, now_us)
}

/// Exact `v` units of `from` per token in units of `to` per token, floored, and at most
/// `burst` whole tokens (more would be above any capacity anyway). The fraction of a token is
/// a double in the script's order of operations, and never rounds up to a whole token.
fn rescale(v: u64, from: u64, to: u64, burst: u64) -> u64 {
    if from == to {
        return v;
    }
    let whole = (v / from).min(burst);
    let frac = ((v % from) as f64 * to as f64 / from as f64)
        .floor()
        .min((to - 1) as f64) as u64;
    whole * to + frac
}

/// The highest level the bucket may reach: capacity less what is outstanding, never below 0.
fn ceiling(cap: u64, out: u64, scale: u64) -> u64 {
    cap.saturating_sub(out.saturating_mul(scale))
}

/// The quota a stored bucket was written under, if its fields make one with the stored scale.
fn written_under(b: &BucketState) -> Option<Quota> {
    let q = Quota::with_parts(
        b.rate,
        std::time::Duration::from_micros(b.period_us),
        b.burst,
    )
    .ok()?;
    (q.scale() == b.scale).then_some(q)
}

/// Runs one step on `stored`: the caller's `quota` for argument checks, `effective` for the
/// quota the bucket runs under. See [`step`]; a reply of [`QuotaSource::Absent`] changed
/// nothing (and its `None` does not mean "delete").
///
/// When the stored bucket was written under another quota (a central change, or callers that
/// disagree), it is first brought up to `now` under the quota it was written with (refill and
/// expired leases), then rescaled to the new one: tokens in the bucket survive a change, the
/// new rate applies from this call on. Outstanding tokens stay counted; if they exceed the new
/// capacity the bucket stays empty until they are spent, returned or expired.
pub fn step_with(
    stored: &mut Stored,
    quota: &Quota,
    effective: Effective,
    op: Op<'_>,
    now_us: u64,
) -> Result<(StepReply, Option<u64>), InvalidArgument> {
    validate(quota, &op, now_us)?;
    let (quota, source) = match (effective.stored, effective.fallback_to_caller) {
        (Some(q), _) => (q, QuotaSource::Stored),
        (None, true) => (*quota, QuotaSource::Caller),
        (None, false) => {
            let reply = StepReply {
                granted: 0,
                remaining: 0,
                retry_after_us: 0,
                reset_after_us: 0,
                share_mtps: 0,
                rate_mtps: 0,
                leasers: 0,
                quota: *quota,
                source: QuotaSource::Absent,
            };
            // Nothing was read or written: the caller leaves the state and its expiry alone.
            return Ok((reply, None));
        }
    };
    let max = MAX_VALUE;
    let scale = quota.scale();
    let inc = quota.increment();
    let burst = quota.burst();
    let rate = quota.rate();
    let period = quota.period_us();
    let cap = burst * scale;
    let now = now_us;

    // Load; a bucket that is not valid reads as full with nothing outstanding. A bucket
    // written under another quota first runs to `now` under that one (`first`).
    let (mut level, mut ts, mut out, mut dsum, mut res) = (cap, now, 0u64, 0u64, 0u64);
    let mut first = quota;
    if let Some(b) = stored.bucket.filter(|b| {
        b.level <= max
            && (1..=max).contains(&b.scale)
            && b.ts_us <= MAX_TIME_US
            && b.outstanding <= max
            && b.demand <= max
            && b.reserved_mtps <= max
    }) {
        first = written_under(&b).unwrap_or(quota);
        level = rescale(b.level, b.scale, first.scale(), first.burst());
        // Not cut to a burst: after the burst shrank, tokens held above it are still counted.
        out = b.outstanding;
        level = level.min(ceiling(first.burst() * first.scale(), out, first.scale()));
        ts = b.ts_us;
        dsum = b.demand;
        res = b.reserved_mtps;
    }

    // Lazy refill under quota `q` up to time `to`, never above capacity − outstanding, never
    // backwards; at the rate the leasers' rate leases (`res`) leave to the bucket.
    let refill = |q: &Quota, level: &mut u64, ts: &mut u64, out: u64, res: u64, to: u64| {
        if to > *ts {
            let room = ceiling(q.burst() * q.scale(), out, q.scale()).saturating_sub(*level);
            if room > 0 {
                *level += gain(q, res, to - *ts, room);
            }
            *ts = to;
        }
    };

    // The pending claim, unless it has lapsed.
    let mut claim = stored.claim.take().filter(|c| c.until_us > now);
    // Anonymous demand two windows old reads as none.
    let mut anonymous = stored
        .anonymous
        .take()
        .filter(|a| now < a.since_us + 2 * ANON_WINDOW_US)
        .unwrap_or_default();
    // Expired leases, in expiry order (then by id, as a sorted set orders ties). Dropping any
    // leaser drops the claim (its claimant may be the one gone; a due node claims again).
    while let Some((exp, id)) = stored.expiry.first().filter(|(e, _)| *e <= now).cloned() {
        stored.expiry.remove(&(exp, id.clone()));
        refill(&first, &mut level, &mut ts, out, res, exp);
        if let Some(l) = stored.leasers.remove(&id) {
            out = out.saturating_sub(l.outstanding);
            dsum = dsum.saturating_sub(l.demand);
            res = res.saturating_sub(l.rate_mtps);
        }
        claim = None;
    }
    refill(&first, &mut level, &mut ts, out, res, now);
    if first != quota {
        // A full bucket with no leasers is not stored (absent reads as full), so it stays full
        // across a change, as it would once expired; anything else keeps its tokens.
        let first_cap = first.burst() * first.scale();
        level = if level >= first_cap && out == 0 && stored.leasers.is_empty() {
            cap
        } else {
            rescale(level, first.scale(), scale, burst).min(ceiling(cap, out, scale))
        };
        // A claim is in the old quota's units, and so is the anonymous callers' credit: they
        // gain it again from here.
        claim = None;
        if anonymous.current > 0 || anonymous.previous > 0 {
            anonymous.credit = 0;
            anonymous.credit_ts = now;
        }
    }

    let node_lease = matches!(op, Op::Lease { node: Some(_), .. });
    let (mut granted, mut retry, mut share, mut held_rate) = (0u64, 0u64, 0u64, 0u64);
    // Whether anonymous callers ask beside the leasers (a node's lease counts them as one more
    // claimant: see `StepReply::leasers`).
    let mut anonymous_asking = false;
    match op {
        // Above the effective burst (it shrank below the caller's): never grantable.
        Op::Lease { min, .. } if min > burst => {}
        Op::Lease {
            want,
            min,
            node: None,
        } => {
            if stored.leasers.is_empty() {
                // No leaser: the whole level, exactly as one shared bucket.
                let whole = level / scale;
                if whole >= min {
                    granted = whole.min(want);
                    level -= granted * scale;
                }
                let need = min * scale;
                if need > level {
                    retry = fill_time(&quota, res, need - level);
                }
            } else {
                // Beside leasers: one more claimant, with the demand the anonymous callers
                // ask for, granted or not (at most a burst a call: one huge ask must not take
                // every share away), and the reserve of a leaser on the longest automatic
                // horizon, reached against their credit. A claim is not held back from it:
                // claims order leasers (held back from anonymous takes too, a claimant's step
                // stood in the bucket while pure-mode callers waited, 0.9975 → 0.9525 of
                // low-rate's budget with rate leases).
                let fresh = anonymous.current == 0 && anonymous.previous == 0;
                anonymous.count(want.min(burst), now);
                let a = anonymous.per_window(now) as f64 * 1000.0;
                let rho = inc as f64 * a / (dsum as f64 + a);
                let horizon = ANON_HORIZON_US as f64;
                let ccap = (rho * horizon)
                    .floor()
                    .max((min * scale) as f64)
                    .min(cap as f64);
                // Gained for the time since it last gained a unit: callers a microsecond or two
                // apart each gain less than a unit at a high rate, and moving its time on
                // without a unit would lose it.
                let gain = if now > anonymous.credit_ts {
                    (rho * (now - anonymous.credit_ts) as f64).floor()
                } else {
                    0.0
                };
                if fresh {
                    anonymous.credit = ccap as u64;
                    anonymous.credit_ts = now;
                } else if gain > 0.0 {
                    anonymous.credit = (anonymous.credit as f64 + gain).min(ccap) as u64;
                    anonymous.credit_ts = now;
                } else {
                    anonymous.credit = (anonymous.credit as f64).min(ccap) as u64;
                }
                let reserve = reserve_tokens(&quota, horizon);
                let whole = level / scale;
                let mut free = whole.saturating_sub(reserve);
                let avail = free + (whole - free).min(anonymous.credit / scale);
                if avail >= min {
                    granted = want.min(avail);
                    level -= granted * scale;
                    anonymous.credit = anonymous
                        .credit
                        .saturating_sub(granted.saturating_sub(free) * scale);
                    free = (level / scale).saturating_sub(reserve);
                }
                // When a take of `min` could succeed: once the level holds it, and where the
                // level above the reserve does not, once the credit covers the rest or the
                // level the reserve too, whichever is first.
                if min * scale > level {
                    retry = fill_time(&quota, res, min * scale - level);
                }
                if free < min {
                    let credit_short = ((min - free) * scale).saturating_sub(anonymous.credit);
                    if credit_short > 0 {
                        let above = (reserve + min) * scale;
                        let mut wait = fill_time(&quota, res, above.saturating_sub(level));
                        if rho > 0.0 {
                            wait = wait.min((credit_short as f64 / rho).ceil() as u64);
                        }
                        retry = retry.max(wait.min(MAX_TIME_US));
                    }
                }
            }
        }
        Op::Lease {
            want,
            min,
            node: Some(n),
        } => {
            // Whether the bucket sits at its ceiling (its refill lost) before this call
            // reports what the node spent: a rate lease may then take beyond the share.
            let at_ceiling = level >= ceiling(cap, out, scale);
            let fresh = !stored.leasers.contains_key(n.id);
            let mut r = stored.leasers.get(n.id).copied().unwrap_or(Leaser {
                outstanding: 0,
                demand: 0,
                credit: 0,
                credit_ts: now,
                expires_us: 0,
                release_seq: 0,
                rate_mtps: 0,
            });
            // What it no longer holds, it spent. The rate it held ends here (a new one may
            // start below).
            let held = n.held.min(r.outstanding);
            out = out.saturating_sub(r.outstanding - held);
            r.outstanding = held;
            // Releases it sent up to here are in `held` already: one the store runs after
            // this lease (late, or retried) would return tokens counted as spent here.
            r.release_seq = r.release_seq.max(n.release_seq);
            res = res.saturating_sub(r.rate_mtps);
            let old_rate = std::mem::take(&mut r.rate_mtps);
            dsum = (dsum.saturating_sub(r.demand) + n.demand_mtps).min(max);
            r.demand = n.demand_mtps;
            // Its share of the rate among the leasers' demand and the anonymous callers'.
            let anon = anonymous.per_window(now) as f64 * 1000.0;
            anonymous_asking = anon > 0.0;
            let whole_share = if n.demand_mtps > 0 {
                inc as f64 * n.demand_mtps as f64 / (dsum as f64 + anon)
            } else {
                0.0
            };
            share = (whole_share * 1e9 / scale as f64).floor().min(max as f64) as u64;
            // What a rate lease brought it is its share already: credit, and the size a grant
            // must reach, go by the rest of its share.
            let rho = (whole_share - old_rate as f64 * scale as f64 / 1e9).max(0.0);
            let horizon = n.horizon_us as f64;
            // At least `min`, so a request larger than a horizon of share waits, not forever.
            let ccap = (rho * horizon)
                .floor()
                .max((min * scale) as f64)
                .min(cap as f64);
            r.credit = if fresh {
                ccap as u64
            } else if now > r.credit_ts {
                // For the whole time since its last call: a share whose horizon holds less
                // than `min` would otherwise gain under a token a call, and need several
                // calls for one.
                let dt = (now - r.credit_ts) as f64;
                (r.credit as f64 + (rho * dt).floor()).min(ccap) as u64
            } else {
                (r.credit as f64).min(ccap) as u64
            };
            r.credit_ts = r.credit_ts.max(now);
            // Another node's claim is held back from this one (its own is not).
            let mine = claim.as_ref().is_some_and(|c| c.node == n.id);
            let hold = match &claim {
                Some(c) if !mine => c.units,
                _ => 0,
            };
            let whole = level.saturating_sub(hold) / scale;
            let reserve = reserve_tokens(&quota, horizon);
            let free = whole.saturating_sub(reserve);
            let avail = free + (whole - free).min(r.credit / scale);
            let floor_tokens = (rho * horizon / scale as f64)
                .floor()
                .min(want as f64)
                .min(burst as f64) as u64;
            let mut need = min.max(floor_tokens);
            // Served once it can get seven eighths of its step (rounded down): its share (and
            // with it its step) moves a little between calls, and a refusal for the difference
            // costs a call for nothing. A refused node is still told when its whole step is
            // there: coming back for seven eighths would serve it smaller steps, more often,
            // than first-come takers of the level above the reserve.
            let enough = min.max(floor_tokens - floor_tokens.div_ceil(8));
            let mut free = free;
            if avail >= enough {
                granted = want.min(avail);
                level -= granted * scale;
                out += granted;
                r.outstanding += granted;
                r.credit = r
                    .credit
                    .saturating_sub(granted.saturating_sub(free) * scale);
                free = (level.saturating_sub(hold) / scale).saturating_sub(reserve);
                // The next ask will be for about the node's whole target (what it held plus
                // what it wanted), not for what was left of this one: pace it for that.
                let target = (rho * horizon / scale as f64)
                    .floor()
                    .min((want + held) as f64)
                    .min(burst as f64) as u64;
                need = min.max(target);
            }
            // A rate lease, if asked for: at most its share (any rate while the bucket sat at
            // its ceiling: what no leaser holds would only be lost), the rate no other leaser
            // holds, and what its counted tokens can carry: it drips into them less one step's
            // worth (`drip_slack`), so they must hold at least two steps' worth.
            let step = drip_step_us(n.horizon_us);
            if n.rate_mtps > 0 && step > 0 {
                let fleet = (rate as f64 * 1e9 / period as f64).floor().min(max as f64) as u64;
                let fits = ((r.outstanding / 2) as f64 * 1e9 / step as f64).floor() as u64;
                let tau = n
                    .rate_mtps
                    .min(if at_ceiling { fleet } else { share })
                    .min(fleet.saturating_sub(res))
                    .min(fits);
                if tau > 0 {
                    res += tau;
                    r.rate_mtps = tau;
                    held_rate = tau;
                }
            }
            // When the next lease of `need` could succeed (0 if it could now), after a grant
            // too, so a node paces itself instead of asking in vain: against credit once the
            // bucket holds `need`; or, if the bucket is already above the reserve, first come
            // first served once it holds `need` above it (below the reserve that is a mirage:
            // other nodes drain the bucket long before it gets there).
            let short = need * scale + hold;
            if short > level {
                retry = fill_time(&quota, res, short - level);
                // Refill stops at capacity − outstanding: past that, tokens come back only as
                // other nodes report what they spent (at their next lease, about a horizon
                // away) or return it, so asking sooner would only come back empty.
                if short > ceiling(cap, out, scale) {
                    retry = retry.max(n.horizon_us / 4);
                }
            }
            if free < need {
                let credit_need = (need - free) * scale;
                if credit_need > r.credit {
                    let credit_short = credit_need - r.credit;
                    // From here its credit accrues at its share less the rate it holds
                    // after this call, not the one it held before: a node that gave its rate
                    // up (its counted tokens ran out) was told to wait for its credit at the
                    // sliver of share the old rate had left, 23 s at 1 000 nodes.
                    let next = (whole_share - held_rate as f64 * scale as f64 / 1e9).max(0.0);
                    let wait = if next > 0.0 {
                        (credit_short as f64 / next).ceil()
                    } else if held_rate > 0 {
                        // Its rate is all its share: only tokens above the reserve are for it.
                        let above = (reserve + need) * scale + hold;
                        horizon.max(fill_time(&quota, res, above.saturating_sub(level)) as f64)
                    } else {
                        horizon
                    };
                    if wait > retry as f64 {
                        retry = wait.min(MAX_TIME_US as f64) as u64;
                    }
                }
            }
            let above = (reserve + need) * scale + hold;
            if level.saturating_sub(hold) / scale >= reserve && above <= ceiling(cap, out, scale) {
                retry = retry.min(fill_time(&quota, res, above.saturating_sub(level)));
            }
            if !fresh {
                stored.expiry.remove(&(r.expires_us, n.id.to_owned()));
            }
            r.expires_us = (now + n.ttl_us).min(MAX_TIME_US);
            // A claim: refused, due (its credit covers its whole step) and short only because
            // the level is, with no other claim pending and a step the bucket can reach. It
            // lasts until the refill should have served it and a quarter horizon more (never
            // past its lease); collected, or no longer due, it ends.
            let step_units = need * scale;
            if granted == 0
                && rho > 0.0
                && hold == 0
                && r.credit >= step_units
                && step_units > level
                && step_units <= ceiling(cap, out, scale)
            {
                claim = Some(Claim {
                    node: n.id.to_owned(),
                    units: step_units,
                    until_us: (now + retry + drip_step_us(n.horizon_us)).min(r.expires_us),
                });
            } else if mine {
                claim = None;
            }
            stored.expiry.insert((r.expires_us, n.id.to_owned()));
            stored.leasers.insert(n.id.to_owned(), r);
        }
        Op::Release { tokens, node: None } => {
            level = (level + tokens.min(burst) * scale).min(ceiling(cap, out, scale));
        }
        Op::Release {
            tokens,
            node: Some(n),
        } => {
            if let Some(r) = stored.leasers.get_mut(n.id) {
                if n.seq > r.release_seq {
                    let give = tokens.min(r.outstanding);
                    r.outstanding -= give;
                    out = out.saturating_sub(give);
                    level = (level + give.min(burst) * scale).min(ceiling(cap, out, scale));
                    r.release_seq = n.seq;
                    if n.leaving {
                        claim = None;
                        let r = stored.leasers.remove(n.id).expect("present");
                        stored.expiry.remove(&(r.expires_us, n.id.to_owned()));
                        out = out.saturating_sub(r.outstanding);
                        dsum = dsum.saturating_sub(r.demand);
                        res = res.saturating_sub(r.rate_mtps);
                    }
                }
            }
        }
    }

    let reset = fill_time(&quota, res, ceiling(cap, out, scale).saturating_sub(level));
    let last_expiry = stored.expiry.last().map(|(e, _)| *e);
    let keep_ms = if level >= cap && out == 0 && last_expiry.is_none() {
        stored.bucket = None;
        None
    } else {
        stored.claim = claim;
        // Kept with the leasers' bookkeeping, which goes with the last leaser.
        stored.anonymous = (last_expiry.is_some()
            && (anonymous.current > 0 || anonymous.previous > 0))
            .then_some(anonymous);
        stored.bucket = Some(BucketState {
            level,
            scale,
            ts_us: ts,
            outstanding: out,
            demand: dsum,
            rate,
            period_us: period,
            burst,
            reserved_mtps: res,
        });
        // Kept until it would be full: every lease expired, then the whole capacity refilled.
        let mut keep = (cap - level).div_ceil(inc).div_ceil(1000);
        if let Some(last) = last_expiry {
            keep += last.saturating_sub(now).div_ceil(1000);
        }
        Some(keep + SLACK_MS)
    };
    let reply = StepReply {
        granted,
        remaining: level / scale,
        retry_after_us: retry,
        reset_after_us: reset,
        share_mtps: share,
        rate_mtps: held_rate,
        leasers: if node_lease {
            stored.leasers.len() as u64 + u64::from(anonymous_asking)
        } else {
            0
        },
        quota,
        source,
    };
    Ok((reply, keep_ms))
}

/// The script's argument checks, in the script's order.
fn validate(quota: &Quota, op: &Op<'_>, now_us: u64) -> Result<(), InvalidArgument> {
    let burst = quota.burst();
    match *op {
        Op::Lease { want, min, .. } => {
            if want == 0 || want > MAX_VALUE {
                return Err(InvalidArgument("want"));
            }
            if min == 0 || min > want || min > burst {
                return Err(InvalidArgument("min"));
            }
        }
        Op::Release { tokens, .. } => {
            if tokens > MAX_VALUE {
                return Err(InvalidArgument("tokens"));
            }
        }
    }
    if now_us > MAX_TIME_US {
        return Err(InvalidArgument("now_us"));
    }
    match *op {
        Op::Lease { node: Some(n), .. } => {
            if n.id.is_empty() || n.id.len() > MAX_NODE_LEN {
                return Err(InvalidArgument("node"));
            }
            if n.held > MAX_VALUE {
                return Err(InvalidArgument("held"));
            }
            if n.demand_mtps > MAX_VALUE {
                return Err(InvalidArgument("demand"));
            }
            if n.horizon_us == 0 || n.horizon_us > MAX_VALUE {
                return Err(InvalidArgument("horizon_us"));
            }
            if n.ttl_us == 0 || n.ttl_us > MAX_VALUE {
                return Err(InvalidArgument("ttl_us"));
            }
            if n.rate_mtps > MAX_VALUE {
                return Err(InvalidArgument("rate_mtps"));
            }
            if n.release_seq > MAX_VALUE {
                return Err(InvalidArgument("release_seq"));
            }
        }
        Op::Release { node: Some(n), .. } => {
            if n.id.is_empty() || n.id.len() > MAX_NODE_LEN {
                return Err(InvalidArgument("node"));
            }
            if n.seq > MAX_VALUE {
                return Err(InvalidArgument("seq"));
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn lease(st: &mut Stored, q: &Quota, want: u64, min: u64, now: u64) -> StepReply {
        let op = Op::Lease {
            want,
            min,
            node: None,
        };
        step(st, q, op, now).unwrap().0
    }

    fn node_lease(
        st: &mut Stored,
        q: &Quota,
        id: &str,
        want: u64,
        held: u64,
        demand: u64,
        now: u64,
    ) -> StepReply {
        rated_lease(st, q, id, want, held, demand, 0, now)
    }

    /// A node's lease arguments: a 100 ms horizon, a 1 s ttl, no rate, no release sent.
    fn node_args(id: &str, held: u64, demand: u64) -> NodeLeaseArgs<'_> {
        NodeLeaseArgs {
            id,
            held,
            demand_mtps: demand,
            horizon_us: 100_000,
            ttl_us: 1_000_000,
            rate_mtps: 0,
            release_seq: 0,
        }
    }

    /// A lease of between 1 and `want` tokens by `node`.
    fn lease_by(
        st: &mut Stored,
        q: &Quota,
        want: u64,
        node: NodeLeaseArgs<'_>,
        now: u64,
    ) -> StepReply {
        let op = Op::Lease {
            want,
            min: 1,
            node: Some(node),
        };
        step(st, q, op, now).unwrap().0
    }

    /// A node lease (100 ms horizon, 1 s ttl) that also asks for `rate_mtps`.
    #[allow(clippy::too_many_arguments)]
    fn rated_lease(
        st: &mut Stored,
        q: &Quota,
        id: &str,
        want: u64,
        held: u64,
        demand: u64,
        rate_mtps: u64,
        now: u64,
    ) -> StepReply {
        let node = NodeLeaseArgs {
            rate_mtps,
            ..node_args(id, held, demand)
        };
        lease_by(st, q, want, node, now)
    }

    fn release(st: &mut Stored, q: &Quota, tokens: u64, now: u64) -> StepReply {
        step(st, q, Op::Release { tokens, node: None }, now)
            .unwrap()
            .0
    }

    #[test]
    fn new_bucket_is_full_and_grants_up_to_want() {
        let q = Quota::per_second(10).unwrap();
        let mut st = Stored::default();
        let r = lease(&mut st, &q, 4, 1, 0);
        assert_eq!((r.granted, r.remaining, r.retry_after_us), (4, 6, 0));
        assert_eq!(r.reset_after_us, 400_000);
    }

    #[test]
    fn all_or_nothing_below_min() {
        let q = Quota::per_second(10).unwrap();
        let mut st = Stored::default();
        lease(&mut st, &q, 10, 10, 0);
        let r = lease(&mut st, &q, 3, 3, 150_000); // 1.5 tokens refilled
        assert_eq!((r.granted, r.remaining), (0, 1));
        assert_eq!(r.retry_after_us, 150_000); // 1.5 more tokens at 100 ms each
    }

    #[test]
    fn refill_keeps_fractions_across_calls() {
        // 3 tokens per 10 ms: one token every 3.33 ms. Ten calls 1 ms apart must refill exactly
        // 3 tokens in total, where per-call flooring would refill none.
        let q = Quota::with_parts(3, Duration::from_millis(10), 3).unwrap();
        let mut st = Stored::default();
        lease(&mut st, &q, 3, 3, 0);
        let mut r = release(&mut st, &q, 0, 0);
        for t in 1..=10u64 {
            r = release(&mut st, &q, 0, t * 1_000);
        }
        assert_eq!(r.remaining, 3);
        assert!(st.bucket.is_none(), "a full bucket is deleted");
    }

    #[test]
    fn release_never_exceeds_capacity() {
        let q = Quota::per_second(10).unwrap();
        let mut st = Stored::default();
        lease(&mut st, &q, 2, 1, 0);
        assert_eq!(release(&mut st, &q, 10, 0).remaining, 10);
        assert!(st.bucket.is_none());
    }

    #[test]
    fn clock_going_back_refills_nothing_and_keeps_ts() {
        let q = Quota::per_second(10).unwrap();
        let mut st = Stored::default();
        lease(&mut st, &q, 10, 1, 1_000_000);
        assert_eq!(lease(&mut st, &q, 1, 1, 500_000).granted, 0);
        assert_eq!(st.bucket.unwrap().ts_us, 1_000_000);
    }

    #[test]
    fn a_node_waits_while_outstanding_tokens_block_the_refill() {
        let q = Quota::per_second(1_000).unwrap().with_burst(100).unwrap();
        let mut st = Stored::default();
        // `a` takes the whole bucket: capacity − outstanding is 0, so nothing refills until
        // `a` reports what it spent.
        assert_eq!(
            node_lease(&mut st, &q, "a", 100, 0, 1_000_000, 0).granted,
            100
        );
        let b = node_lease(&mut st, &q, "b", 10, 0, 1_000_000, 0);
        assert_eq!(b.granted, 0);
        // The refill alone would bring 10 tokens in 10 ms; they cannot come that way.
        assert_eq!(b.retry_after_us, 25_000, "a quarter horizon: {b:?}");
        // `a` reports it spent everything: now the refill runs, and `b` is told its time.
        // (`a`, refused a token while due, claims it: `b` waits for its own 10 and that one.)
        node_lease(&mut st, &q, "a", 1, 0, 1_000_000, 1_000);
        assert_eq!(st.claim.as_ref().map(|c| c.node.as_str()), Some("a"));
        let b = node_lease(&mut st, &q, "b", 10, 0, 1_000_000, 1_000);
        assert_eq!((b.granted, b.retry_after_us), (0, 11_000), "{b:?}");
    }

    /// 1 000/s, burst 1 000 (one unit per µs, 1 000 units a token; horizon 100 ms, so the
    /// reserve is 50 tokens): `s` (a tenth of the demand) drains the bucket to 40 tokens and
    /// reports it spent; `b` (nine tenths) is due — its credit covers its step of 90 — but the
    /// level is 40: refused, it claims its step and is told when the refill reaches it.
    fn b_claims_at_40_tokens(q: &Quota) -> (Stored, StepReply) {
        let mut st = Stored::default();
        assert_eq!(node_lease(&mut st, q, "s", 950, 0, 100_000, 0).granted, 950);
        assert_eq!(node_lease(&mut st, q, "s", 10, 0, 100_000, 0).granted, 10);
        let b = node_lease(&mut st, q, "b", 150, 0, 900_000, 0);
        (st, b)
    }

    #[test]
    fn a_due_node_short_of_level_claims_its_step_before_smaller_steps() {
        let q = Quota::per_second(1_000).unwrap();
        let (mut st, b) = b_claims_at_40_tokens(&q);
        assert_eq!((b.granted, b.retry_after_us), (0, 50_000), "{b:?}");
        let claim = st.claim.clone().expect("a claim");
        assert_eq!((claim.node.as_str(), claim.units), ("b", 90_000));
        // 30 ms on the level is 70 tokens, far above `s`'s step of 10, and `s` has the credit:
        // without the claim it would be served. The claim holds 90 back, so it waits until the
        // refill covers both.
        let s = node_lease(&mut st, &q, "s", 10, 0, 100_000, 30_000);
        assert_eq!((s.granted, s.retry_after_us), (0, 30_000), "{s:?}");
        // `b` comes back at its time and collects; the claim ends.
        assert_eq!(
            node_lease(&mut st, &q, "b", 150, 0, 900_000, 50_000).granted,
            90
        );
        assert_eq!(st.claim, None);
        // … and `s` is served at its.
        assert_eq!(
            node_lease(&mut st, &q, "s", 10, 0, 100_000, 60_000).granted,
            10
        );
    }

    #[test]
    fn seven_eighths_of_a_step_are_served_and_a_refusal_waits_for_all_of_it() {
        // 1 000/s (one unit per µs, 1 000 units a token), horizon 100 ms: `n`, the only
        // leaser, has a step of 100 tokens; seven eighths are 87.
        let q = Quota::per_second(1_000).unwrap();
        let mut st = Stored::default();
        // (Drained before `n` leases: no anonymous demand shares the rate with it.)
        assert_eq!(lease(&mut st, &q, 900, 900, 0).granted, 900);
        assert_eq!(
            node_lease(&mut st, &q, "n", 100, 0, 1_000_000, 0).granted,
            100
        );
        // Empty: refused, and told when its whole step is there.
        let r = node_lease(&mut st, &q, "n", 100, 0, 1_000_000, 0);
        assert_eq!((r.granted, r.retry_after_us), (0, 100_000), "{r:?}");
        // At 80 tokens, still refused, and still for the whole step (not for 87).
        let mut at_80 = st.clone();
        let r = node_lease(&mut at_80, &q, "n", 100, 0, 1_000_000, 80_000);
        assert_eq!((r.granted, r.retry_after_us), (0, 20_000), "{r:?}");
        // At 90 tokens it is served what there is rather than refused for the last 10.
        let r = node_lease(&mut st, &q, "n", 100, 0, 1_000_000, 90_000);
        assert_eq!(r.granted, 90, "{r:?}");
    }

    #[test]
    fn a_claim_lapses_when_its_node_does_not_come_back() {
        let q = Quota::per_second(1_000).unwrap();
        let (mut st, b) = b_claims_at_40_tokens(&q);
        assert_eq!(b.granted, 0);
        let until = st.claim.as_ref().expect("a claim").until_us;
        // Its retry (50 ms) and a quarter horizon (25 ms) more.
        assert_eq!(until, 75_000);
        // Past that, `s` sees the whole level again (115 tokens: its whole want).
        let s = node_lease(&mut st, &q, "s", 10, 0, 100_000, until);
        assert_eq!(s.granted, 10, "{s:?}");
        assert_eq!(st.claim, None);
    }

    #[test]
    fn corrupt_state_reads_as_full() {
        let q = Quota::per_second(10).unwrap();
        let mut st = Stored {
            bucket: Some(BucketState {
                level: 5,
                scale: 0,
                ts_us: 0,
                outstanding: 0,
                demand: 0,
                rate: 0,
                period_us: 0,
                burst: 0,
                reserved_mtps: 0,
            }),
            leasers: BTreeMap::new(),
            expiry: BTreeSet::new(),
            claim: None,
            anonymous: None,
        };
        assert_eq!(lease(&mut st, &q, 10, 1, 0).granted, 10);
    }

    #[test]
    fn rejects_bad_arguments_without_changing_anything() {
        let q = Quota::per_second(10).unwrap();
        let mut st = Stored::default();
        lease(&mut st, &q, 3, 1, 0);
        let before = st.clone();
        let mut e = |op| step(&mut st, &q, op, 0).unwrap_err().0;
        assert_eq!(
            e(Op::Lease {
                want: 0,
                min: 0,
                node: None
            }),
            "want"
        );
        assert_eq!(
            e(Op::Lease {
                want: 5,
                min: 6,
                node: None
            }),
            "min"
        );
        assert_eq!(
            e(Op::Lease {
                want: 20,
                min: 11,
                node: None
            }),
            "min"
        );
        assert_eq!(
            e(Op::Release {
                tokens: MAX_VALUE + 1,
                node: None
            }),
            "tokens"
        );
        let node = NodeLeaseArgs {
            id: "n",
            held: MAX_VALUE + 1,
            demand_mtps: 0,
            horizon_us: 1,
            ttl_us: 1,
            rate_mtps: 0,
            release_seq: 0,
        };
        assert_eq!(
            e(Op::Lease {
                want: 1,
                min: 1,
                node: Some(node)
            }),
            "held"
        );
        let node = NodeLeaseArgs {
            id: "n",
            held: 0,
            demand_mtps: 0,
            horizon_us: 0,
            ttl_us: 1,
            rate_mtps: 0,
            release_seq: 0,
        };
        assert_eq!(
            e(Op::Lease {
                want: 1,
                min: 1,
                node: Some(node)
            }),
            "horizon_us"
        );
        // Checked last, as the script does (after the rate asked).
        let node = NodeLeaseArgs {
            id: "n",
            held: 0,
            demand_mtps: 0,
            horizon_us: 1,
            ttl_us: 1,
            rate_mtps: MAX_VALUE + 1,
            release_seq: MAX_VALUE + 1,
        };
        assert_eq!(
            e(Op::Lease {
                want: 1,
                min: 1,
                node: Some(node)
            }),
            "rate_mtps"
        );
        let node = NodeLeaseArgs {
            rate_mtps: 0,
            ..node
        };
        assert_eq!(
            e(Op::Lease {
                want: 1,
                min: 1,
                node: Some(node)
            }),
            "release_seq"
        );
        let too_late = Op::Release {
            tokens: 1,
            node: None,
        };
        assert_eq!(
            step(&mut st, &q, too_late, MAX_TIME_US + 1).unwrap_err().0,
            "now_us"
        );
        assert_eq!(st, before);
    }

    #[test]
    fn outstanding_tokens_cap_the_refill() {
        // Capacity 10. A node leases 6 and holds them: the bucket refills to 4, not 10.
        let q = Quota::per_second(10).unwrap();
        let mut st = Stored::default();
        assert_eq!(node_lease(&mut st, &q, "a", 6, 0, 1_000, 0).granted, 6);
        assert_eq!(release(&mut st, &q, 0, 500_000).remaining, 4);
        // At 0.6 s it reports holding 2 (so it spent 4) and leases 1 more: 3 outstanding.
        node_lease(&mut st, &q, "a", 1, 2, 1_000, 600_000);
        assert_eq!(st.bucket.unwrap().outstanding, 3, "2 held + 1 just leased");
        // The store learnt of the spending at 0.6 s (no refill before: no room), then refills
        // at 10/s: 3 + 3 by 0.9 s, and never above 10 - 3 = 7.
        assert_eq!(release(&mut st, &q, 0, 900_000).remaining, 6);
        assert_eq!(release(&mut st, &q, 0, 1_500_000).remaining, 7);
    }

    #[test]
    fn expired_leases_free_room_at_their_expiry_time() {
        let q = Quota::per_second(10).unwrap();
        let mut st = Stored::default();
        node_lease(&mut st, &q, "a", 10, 0, 1_000, 0); // takes all 10, lease expires at 1 s
                                                       // At 0.5 s: no room, nothing refilled.
        assert_eq!(release(&mut st, &q, 0, 500_000).remaining, 0);
        // At 1.3 s: room from 1.0 s on, so 3 tokens, not 10 and not 13.
        assert_eq!(release(&mut st, &q, 0, 1_300_000).remaining, 3);
        assert!(st.leasers.is_empty());
        assert_eq!(st.bucket.unwrap().outstanding, 0);
    }

    #[test]
    fn node_releases_are_idempotent() {
        let q = Quota::per_minute(100).unwrap();
        let mut st = Stored::default();
        node_lease(&mut st, &q, "a", 50, 0, 1_000, 0);
        let give = |st: &mut Stored, seq| {
            let node = NodeReleaseArgs {
                id: "a",
                seq,
                leaving: false,
            };
            step(
                st,
                &q,
                Op::Release {
                    tokens: 20,
                    node: Some(node),
                },
                0,
            )
            .unwrap()
            .0
        };
        assert_eq!(give(&mut st, 1).remaining, 70);
        assert_eq!(
            give(&mut st, 1).remaining,
            70,
            "a retried release counts once"
        );
        assert_eq!(give(&mut st, 2).remaining, 90);
        assert_eq!(st.leasers["a"].outstanding, 10);
    }

    /// A release the store runs after the node's next lease, which already reported its tokens
    /// gone (`held`), is ignored: the lease carried its seq. Node `a` leases the whole burst,
    /// trims 4 and sends their release (seq 1), which is delayed; it leases again holding 6,
    /// then the release lands. Returned again, the 4 tokens were offered beside the 6 `a`
    /// holds: 8 in the bucket 400 ms later, 14 in an instant against a burst of 10. Leaving,
    /// the late release dropped `a`'s new record, leaving its 6 tokens uncounted.
    #[test]
    fn a_release_the_nodes_next_lease_accounted_for_is_ignored() {
        let q = Quota::per_second(10).unwrap();
        for leaving in [false, true] {
            let mut st = Stored::default();
            let lease = |st: &mut Stored, want, held, release_seq| {
                let node = NodeLeaseArgs {
                    release_seq,
                    ..node_args("a", held, 1_000)
                };
                lease_by(st, &q, want, node, 0)
            };
            assert_eq!(lease(&mut st, 10, 0, 0).granted, 10);
            // The second lease says release 1 was sent: its 4 tokens are not in `held`.
            lease(&mut st, 1, 6, 1);
            let late = NodeReleaseArgs {
                id: "a",
                seq: 1,
                leaving,
            };
            let op = Op::Release {
                tokens: 4,
                node: Some(late),
            };
            step(&mut st, &q, op, 0).unwrap();
            // The store offers at most the burst less what `a` holds.
            let offered = release(&mut st, &q, 0, 400_000).remaining;
            assert!(
                offered <= 10 - 6,
                "{offered} offered, 6 held (leaving {leaving})"
            );
            assert_eq!(offered, 4);
            let record = st.leasers.get("a").map(|r| r.outstanding);
            assert_eq!(record, Some(6), "leaving {leaving}");
            assert_eq!(st.bucket.unwrap().outstanding, 6);
        }
    }

    /// A lease's release seq starts a new record's, and never lowers one: a node whose record
    /// expired starts again from the seq it reports, and an older client (0) changes nothing.
    #[test]
    fn a_lease_raises_the_records_release_seq_and_never_lowers_it() {
        let q = Quota::per_minute(100).unwrap();
        let mut st = Stored::default();
        let lease = |st: &mut Stored, release_seq| {
            let node = NodeLeaseArgs {
                release_seq,
                ..node_args("a", 0, 1_000)
            };
            lease_by(st, &q, 10, node, 0);
            st.leasers["a"].release_seq
        };
        assert_eq!(lease(&mut st, 3), 3, "a new record starts from it");
        assert_eq!(lease(&mut st, 0), 3, "0: none");
        assert_eq!(lease(&mut st, 2), 3, "never lowered");
        assert_eq!(lease(&mut st, 7), 7);
        // The next release the node sends (8) is applied; 7 and below are not.
        let give = |st: &mut Stored, seq| {
            let node = NodeReleaseArgs {
                id: "a",
                seq,
                leaving: false,
            };
            let op = Op::Release {
                tokens: 5,
                node: Some(node),
            };
            step(st, &q, op, 0).unwrap();
            st.leasers["a"].outstanding
        };
        assert_eq!(give(&mut st, 7), 10);
        assert_eq!(give(&mut st, 8), 5);
    }

    /// A rate lease goes beyond the node's share only while the bucket sits at its ceiling
    /// (what no leaser holds would refill it only to be lost).
    #[test]
    fn a_rate_beyond_the_share_only_while_the_bucket_is_at_its_ceiling() {
        // 1 000/s, burst 1 000 (a reserve of 50 tokens under a 100 ms horizon); two nodes of
        // equal demand: a share of 500/s each.
        let q = Quota::per_second(1_000).unwrap();
        let mut st = Stored::default();
        let rated = |st: &mut Stored, id, want, held, now| {
            rated_lease(st, &q, id, want, held, 1_000_000, 800_000, now)
        };
        node_lease(&mut st, &q, "b", 10, 0, 1_000_000, 0);
        // Grants keep level + outstanding at the capacity: at the ceiling, `a` gets the 800/s
        // it asks for (its 40 counted tokens carry that over a 25 ms step).
        let a = rated(&mut st, "a", 40, 0, 0);
        assert_eq!(
            (a.granted, a.share_mtps, a.rate_mtps),
            (40, 500_000, 800_000)
        );
        // Whether the bucket is at its ceiling is read when the call starts: `a`'s own report
        // of its 40 spent opens room below it, and still it keeps 800/s (on 40 new tokens).
        let a = rated(&mut st, "a", 40, 0, 0);
        assert_eq!((a.granted, a.rate_mtps), (40, 800_000), "{a:?}");
        // `b` reports its 10 spent: room below the ceiling (at the same instant: no refill).
        // Now `a` is held to its share.
        node_lease(&mut st, &q, "b", 1, 0, 1_000_000, 0);
        let a = rated(&mut st, "a", 1, 40, 0);
        assert_eq!((a.share_mtps, a.rate_mtps), (500_000, 500_000), "{a:?}");
    }

    #[test]
    fn anonymous_demand_counts_in_the_shares() {
        // 1 000/s, burst 1 000: `a`, the one leaser, reports 1 000/s of demand; its share is
        // the whole rate, and it holds 600/s.
        let q = Quota::per_second(1_000).unwrap();
        let mut st = Stored::default();
        let rated = |st: &mut Stored, held, now| {
            rated_lease(st, &q, "a", 40, held, 1_000_000, 600_000, now)
        };
        let a = rated(&mut st, 0, 0);
        assert_eq!((a.share_mtps, a.rate_mtps), (1_000_000, 600_000), "{a:?}");
        // Anonymous calls ask for 3 000 tokens within the second (granted or not): counted.
        for i in 0..30 {
            lease(&mut st, &q, 100, 1, 10_000 + i * 1_000);
        }
        let anon = st.anonymous.expect("counted beside a leaser");
        assert_eq!((anon.current, anon.previous), (3_000, 0));
        // Renewed, `a`'s share is its part of 1 000/s + 3 000/s of demand: 250/s, and so is
        // the rate it may hold.
        let a = rated(&mut st, 40, 100_000);
        assert_eq!((a.share_mtps, a.rate_mtps), (250_000, 250_000), "{a:?}");
        // Counted per second: after two quiet seconds it is gone, and so is the cap.
        let a = rated(&mut st, 40, 2_100_000);
        assert_eq!((a.share_mtps, a.rate_mtps), (1_000_000, 600_000), "{a:?}");
        // Beside a leaser that holds no rate it is counted too; with no leaser, not.
        let mut st = Stored::default();
        node_lease(&mut st, &q, "a", 40, 0, 1_000_000, 0);
        lease(&mut st, &q, 100, 1, 1_000);
        assert_eq!(st.anonymous.map(|a| a.current), Some(100));
        let mut st = Stored::default();
        lease(&mut st, &q, 100, 1, 1_000);
        assert_eq!(st.anonymous, None);
    }

    #[test]
    fn anonymous_credit_keeps_what_calls_a_microsecond_apart_gain() {
        // 1 000 000/s: a token a unit, a unit a µs. The anonymous callers' share is about
        // half (their asks beside `a`'s 1 000 000/s), under a unit between two calls a µs
        // apart: each call's gain rounds to 0, and only the time since the last whole unit
        // makes one.
        let q = Quota::per_second(1_000_000).unwrap();
        let mut st = Stored::default();
        node_lease(&mut st, &q, "a", 1, 0, 1_000_000_000, 0);
        // Everything above the reserve and the first credit (124 999 units: a hair under
        // half of 250 ms): a token is left.
        let r = lease(&mut st, &q, 999_999, 1, 0);
        assert_eq!((r.granted, r.remaining), (999_998, 1), "{r:?}");
        // Then a call a µs: the level grows (all of it reserve), the credit by half a unit.
        let granted: u64 = (1..=2_000)
            .map(|t| lease(&mut st, &q, 1, 1, t).granted)
            .sum();
        assert!((900..=1_100).contains(&granted), "{granted} of 2 000");
    }

    #[test]
    fn an_anonymous_take_beside_leasers_reaches_the_reserve_against_its_credit() {
        // 1 000/s, burst 1 000 (1 000 units a token, one a µs). The reserve an anonymous take
        // sees is a leaser's on the longest automatic horizon: 125 tokens (half of 250 ms).
        let q = Quota::per_second(1_000).unwrap();
        let mut st = Stored::default();
        assert_eq!(
            node_lease(&mut st, &q, "a", 100, 0, 1_000_000, 0).granted,
            100
        );
        // Asking for 900 of the 900 left: 900/s of anonymous demand beside `a`'s 1 000/s, a
        // share of 0.4737 units a µs, and a first credit of 250 ms of it (118 421 units): the
        // 775 tokens above the reserve and 118 of it.
        let r = lease(&mut st, &q, 900, 1, 0);
        assert_eq!((r.granted, r.remaining), (893, 7), "{r:?}");
        assert_eq!(st.anonymous.map(|a| a.credit), Some(421));
        // Then 7 tokens are there, all reserve, and 421 units of credit: refused, and told
        // when the credit covers a token (579 units at 901/1 901 of a unit a µs: 1 222 µs).
        let r = lease(&mut st, &q, 1, 1, 0);
        assert_eq!(
            (r.granted, r.remaining, r.retry_after_us),
            (0, 7, 1_222),
            "{r:?}"
        );
        let r = lease(&mut st, &q, 1, 1, 1_222);
        assert_eq!(r.granted, 1, "{r:?}");
    }

    #[test]
    fn a_retry_beside_held_rates_waits_at_most_a_little_beyond_the_whole_rate() {
        // 1 000/s, burst 1 000; `a` holds 950/s (taken at the ceiling), so the bucket refills
        // at 50/s. `b`, leasing tokens, drains it and comes back for a horizon of its 500/s
        // share: 50 tokens, a second away at 50/s, 50 ms at the whole rate.
        let q = Quota::per_second(1_000).unwrap();
        let mut st = Stored::default();
        node_lease(&mut st, &q, "b", 10, 0, 1_000_000, 0);
        let a = rated_lease(&mut st, &q, "a", 100, 0, 1_000_000, 950_000, 0);
        assert_eq!((a.granted, a.rate_mtps), (100, 950_000), "{a:?}");
        let b = node_lease(&mut st, &q, "b", 1_000, 0, 1_000_000, 0);
        assert!(b.granted > 800, "{b:?}");
        let b = node_lease(&mut st, &q, "b", 50, 0, 1_000_000, 1_000);
        assert_eq!(b.granted, 0, "{b:?}");
        // The rate may be renewed smaller any time: `b` looks again within 100 ms beyond the
        // 50 ms the whole rate would take, not after the second the refill left would.
        assert!((100_000..=150_000).contains(&b.retry_after_us), "{b:?}");
    }

    #[test]
    fn a_node_that_gives_its_rate_up_waits_for_credit_at_its_whole_share() {
        // 1 000/s; `a` and `b` report the same demand: 500/s each. `a` holds its share as a
        // rate, then `b` drains the bucket.
        let q = Quota::per_second(1_000).unwrap();
        let mut st = Stored::default();
        node_lease(&mut st, &q, "b", 1, 0, 1_000_000, 0);
        let a = rated_lease(&mut st, &q, "a", 100, 0, 1_000_000, 500_000, 0);
        assert_eq!((a.granted, a.rate_mtps), (100, 500_000), "{a:?}");
        let b = node_lease(&mut st, &q, "b", 1_000, 1, 1_000_000, 0);
        assert!(b.granted > 800, "{b:?}");
        // `b` spends them (the bucket may refill again: 5 tokens in the next 10 ms).
        node_lease(&mut st, &q, "b", 1, 0, 1_000_000, 0);
        // 10 ms on, `a` has spent its tokens and asks for tokens alone (its counted tokens no
        // longer carry a rate); its demand rose a little, so its share is 500.25/s and the
        // old rate left it a quarter of a token a second. Its credit, capped by that, buys
        // it one token of the reserve.
        let a = rated_lease(&mut st, &q, "a", 50, 0, 1_001_000, 0, 10_000);
        assert_eq!((a.granted, a.rate_mtps), (1, 0), "{a:?}");
        // From here its credit accrues at its whole share: a token is 2 ms of it, a horizon
        // at most (at the quarter token a second it was told 4 s, and slept through its lease).
        assert!(a.retry_after_us <= 100_000, "{a:?}");
    }

    #[test]
    fn a_share_below_a_token_a_horizon_earns_its_token_in_one_call() {
        // 1 000/s; `b` reports 995/s of demand and holds 995 tokens, so the bucket never
        // rises above 5 (capacity less what is held), inside the reserve of 50: `a`, at 5/s,
        // is served only against credit. Its horizon (100 ms) holds half a token.
        let q = Quota::per_second(1_000).unwrap();
        let mut st = Stored::default();
        let b = node_lease(&mut st, &q, "b", 995, 0, 995_000, 0);
        assert_eq!(b.granted, 995, "{b:?}");
        let a = node_lease(&mut st, &q, "a", 1, 0, 5_000, 0);
        assert_eq!(
            (a.granted, a.share_mtps),
            (1, 5_000),
            "its first token: {a:?}"
        );
        // 250 ms on, a token and a quarter of share later, it has spent it and asks again.
        let a = node_lease(&mut st, &q, "a", 1, 0, 5_000, 250_000);
        // Credit accrued over the whole 250 ms (capped at the token it may hold). Accrued over
        // one horizon at most, it was half a token: refused, and told to call again in 100 ms.
        assert_eq!(a.granted, 1, "{a:?}");
    }

    #[test]
    fn a_node_lease_counts_the_nodes_holding_leases_and_the_anonymous_callers_as_one() {
        let q = Quota::per_second(1_000).unwrap();
        let mut st = Stored::default();
        assert_eq!(node_lease(&mut st, &q, "a", 1, 0, 1_000, 0).leasers, 1);
        assert_eq!(node_lease(&mut st, &q, "b", 1, 0, 1_000, 0).leasers, 2);
        assert_eq!(node_lease(&mut st, &q, "a", 1, 1, 1_000, 0).leasers, 2);
        // Anonymous calls and releases are not told.
        assert_eq!(lease(&mut st, &q, 1, 1, 0).leasers, 0);
        assert_eq!(release(&mut st, &q, 0, 0).leasers, 0);
        // "a" leaves (its release is not told either): "c" joins "b".
        let leave = NodeReleaseArgs {
            id: "a",
            seq: 1,
            leaving: true,
        };
        let op = Op::Release {
            tokens: 1,
            node: Some(leave),
        };
        assert_eq!(step(&mut st, &q, op, 1).unwrap().0.leasers, 0);
        // "c" joins "b" beside the anonymous callers, who asked at 0 (within their window):
        // one more claimant.
        assert_eq!(
            node_lease(&mut st, &q, "c", 1, 0, 1_000, 500_000).leasers,
            3
        );
        // "b"'s lease (ttl 1 s from 0) expires; the anonymous callers asked in the window
        // before: still counted.
        assert_eq!(
            node_lease(&mut st, &q, "d", 1, 0, 1_000, 1_200_000).leasers,
            3
        );
        // "c"'s lease (from 0.5 s) expires, and the anonymous count is two windows old: a new
        // leaser is alone.
        assert_eq!(
            node_lease(&mut st, &q, "e", 1, 0, 1_000, 2_300_000).leasers,
            1
        );
    }

    #[test]
    fn shares_are_proportional_to_demand() {
        let q = Quota::per_second(1_000).unwrap();
        let mut st = Stored::default();
        node_lease(&mut st, &q, "a", 1, 0, 3_000_000, 0); // 3 000/s
        let b = node_lease(&mut st, &q, "b", 1, 0, 1_000_000, 0); // 1 000/s
        assert_eq!(b.share_mtps, 250_000, "b gets 1/4 of 1 000/s");
        let a = node_lease(&mut st, &q, "a", 1, 1, 3_000_000, 0);
        assert_eq!(a.share_mtps, 750_000);
    }

    #[test]
    fn the_reserve_is_handed_out_against_credit_only() {
        // 1 000/s, burst 200, horizon 100 ms: the reserve is half a horizon of the rate, 50
        // tokens (a quarter of the burst, the most it may be).
        let q = Quota::per_second(1_000).unwrap().with_burst(200).unwrap();
        let mut st = Stored::default();
        // Alone, "z" takes the 150 above the reserve, first come (its credit, 100 tokens,
        // would cover the reserve too; it asks for no more).
        assert_eq!(
            node_lease(&mut st, &q, "z", 150, 0, 1_000_000, 0).granted,
            150
        );
        // Three more join, each taking a token of the reserve against its credit.
        for other in ["b", "c", "d"] {
            assert_eq!(
                node_lease(&mut st, &q, other, 1, 0, 1_000_000, 0).granted,
                1
            );
        }
        // Five nodes with equal demand: "a" may take its credit (a fifth of the rate for a
        // horizon, 20 tokens), not the 47 left.
        let a = node_lease(&mut st, &q, "a", 100, 0, 1_000_000, 0);
        assert_eq!(a.granted, 20, "a's credit: {a:?}");
        let again = node_lease(&mut st, &q, "a", 100, 20, 1_000_000, 0);
        assert_eq!(again.granted, 0, "no credit left");
        assert!(again.retry_after_us > 0);
    }

    #[test]
    fn the_reserve_is_at_most_a_quarter_of_the_burst() {
        // 1 000/s, burst 60, horizon 100 ms: half a horizon of the rate would be 50 tokens,
        // most of the bucket; the reserve is 15 (`burst / RESERVE_PARTS`).
        let q = Quota::per_second(1_000).unwrap().with_burst(60).unwrap();
        let mut st = Stored::default();
        for other in ["b", "c", "d", "e", "f", "g", "h", "i", "j"] {
            node_lease(&mut st, &q, other, 1, 0, 1_000_000, 0);
        }
        // "a" (a tenth of the rate: 10 tokens of credit, under the reserve) finds 51: the 36
        // above the reserve first come, and 10 of the reserve's 15 against its credit. A
        // reserve of 50 let it have 1 + 10; a third of the burst, 31 + 10; a fifth, 39 + 10.
        let a = node_lease(&mut st, &q, "a", 100, 0, 1_000_000, 0);
        assert_eq!(a.granted, 46, "{a:?}");
    }
}
