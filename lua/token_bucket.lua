-- ratelease token bucket: the one atomic step shared by every process.
-- Sent after lua/helpers.lua (MAX, int_val, floor_div, bad, …): the crate's TOKEN_BUCKET_LUA
-- is the two put together.
--
-- KEYS[1]  the bucket        (one packed string: level, scale, time, tokens leased out and not
--                              yet spent or returned, total demand of live leasers, the quota it
--                              was written under, latest lease expiry; see "Load" below)
-- KEYS[2]  the leasers hash  (field = node id, value = a packed record, see `parse` below;
--                              field "" = the leasers' bookkeeping and the pending claim,
--                              see "The leasers' bookkeeping" below)
-- KEYS[3]  the leasers zset  (member = node id, score = lease expiry in µs)
-- KEYS[4]  optional: the config hash (rate, period_us, burst: the name's central quota).
--          Without it the script runs the 3-key protocol: the caller's quota, a 5-entry reply.
-- All keys must share one {hash tag}.
--
-- One key (the bucket alone) for an anonymous lease or release — a pure-mode call, made by a
-- client that knows the name's config (it passes the quota that applies as its own): the
-- 3-key protocol on a bucket with no leaser on record. A command with one key is never split
-- between two cluster nodes, so a slot migration redirects it (ASK) instead of answering
-- TRYAGAIN until the handover, as it does a command whose keys are not all on one node yet
-- (the leasers' keys of a pure-mode bucket never exist). If the bucket has leasers on record
-- (or a format whose leasers are unknown) the reply is { 0 }, one entry: nothing was done,
-- send the call again with every key. Such a client learns the config from its calls with
-- every key (one now and then); a one-key "config_get" (below) reads it on its own.
--
-- ARGV[1]  op: "lease" or "release"; with 4 keys also a config operation (below)
-- ARGV[2]  rate       tokens added per period            (integer, 1 ..= 2^52)
-- ARGV[3]  period_us  period in microseconds              (integer, 1 ..= 2^52)
-- ARGV[4]  burst      bucket capacity in tokens           (integer, 1 ..= 2^52)
-- ARGV[5]  lease: want, the most tokens to grant          (integer, 1 ..= 2^52)
--          release: tokens to give back                   (integer, 0 ..= 2^52; a bucket
--          never rises above capacity, so tokens leased under a larger quota may come back)
-- ARGV[6]  lease: min, the fewest acceptable (all-or-nothing below it; 1 ..= min(want, burst))
--          release: ignored (pass 0)
-- ARGV[7]  now_us: "" to use the Redis server clock (TIME); an explicit time exists only for
--          deterministic tests and replays                (integer, 0 ..= 2^53)
-- ARGV[8]  node: "" for an anonymous call (pure mode), else the leaser's id (≤ 128 bytes)
--   lease with a node:
--   ARGV[9]  held: tokens the node still holds unspent    (integer, 0 ..= 2^52; never more
--            than the store counts for it)
--   ARGV[10] demand: the node's demand, millitokens/s     (integer, 0 ..= 2^52)
--   ARGV[11] horizon_us: how long one lease should last   (integer, 1 ..= 2^52)
--   ARGV[12] ttl_us: how long the lease is valid          (integer, 1 ..= 2^52)
--   release with a node:
--   ARGV[9]  seq: release sequence number; a release whose seq is not above the node's
--            record's (the last one applied, or reported sent by a lease: ARGV[15]) is
--            ignored, so a retried or late release never counts twice
--   ARGV[10] leaving: 1 if the node stops leasing (its record is removed), else 0
-- ARGV[13] with 4 keys, lease and release: what to do when the name has no stored config:
--          "" (or "caller") run under the caller's quota; "none" do nothing (source 2 below)
-- ARGV[14] lease with a node: the rate it asks to hold (a rate lease, below), millitokens per
--          second (integer, 0 ..= 2^52); absent or "": none (with 3 keys the reply then has no
--          rate_mtps; with 4 a node's lease always has it)
-- ARGV[15] lease with a node: release_seq, the seq of the last release the node has sent
--          (integer, 0 ..= 2^52); absent or "": 0, none (see "Releases a lease accounted for")
--
-- Packed node calls (4 keys): a node's lease or release may send its numbers as one string
-- and hear its reply as one. Redis makes a Lua string of every argument and the script parses
-- each number from text, and a reply of eleven integers is eleven conversions: packed, a
-- node's lease, the call a fleet makes most, costs Redis 6 % fewer instructions.
--   ARGV[1]  "node_lease" or "node_release"
--   ARGV[2]  twelve little-endian doubles (96 bytes): the numbers of ARGV[2..7],
--            ARGV[9..12], ARGV[14] and ARGV[15] above, in that order, each an integer in the
--            same range; now_us -1 for the server clock, the rate asked -1 for none,
--            release_seq -1 (or 0) for none, a release's unused fields 0 (min, horizon, ttl,
--            rate, release_seq: ignored)
--   ARGV[3]  the node id (as ARGV[8]; not empty)
--   ARGV[4]  what to do without a stored config (as ARGV[13])
--   Reply: the 4-key reply below (eleven entries for a lease, nine for a release) as that many
--   little-endian doubles, each an integer. The same step runs either way.
--
-- Reply: { granted, remaining, retry_after_us, reset_after_us, share_mtps, rate_mtps }
--   granted        tokens taken by this call (0 for release, and for a lease that could not
--                  reach its minimum)
--   remaining      whole tokens left in the bucket after the call
--   retry_after_us how long until a lease like this one could succeed (0 if it could now);
--                  also sent with a grant, so a node can pace itself instead of asking in vain
--   reset_after_us how long until the bucket stops refilling (capacity − outstanding)
--   share_mtps     the node's fair share of the rate, millitokens per second (0 if anonymous)
--   rate_mtps      with 3 keys, only if the call asked for a rate (ARGV[14]): the rate the node
--                  now holds, millitokens per second (0 if none could be granted)
-- With 4 keys the reply is { granted, remaining, retry_after_us, reset_after_us, share_mtps,
--   rate, period_us, burst, source[, rate_mtps, leasers] }: the quota the call ran under and
--   its source (0 the caller's, 1 the stored config, 2 none: nothing was done, the rest is 0);
--   a node's lease (and only it) gets both last entries: the rate it holds (0 if it asked for
--   none), and `leasers`, the number of nodes holding a lease on the bucket after the call,
--   plus one while anonymous callers ask beside them (one more claimant of the burst, see
--   "Anonymous callers") (0 if the server does not let the script count them: an ACL without
--   ZCARD; while scripts of an earlier version run beside this one, it may be off until the
--   next recount, below).
--
-- Central configuration (4 keys; "config_get" also with 1, the config hash alone, as a
-- one-key client reads it; ARGV[2..4] the quota for init/set, ignored otherwise;
-- reply { rate, period_us, burst, flag }, the config now stored, or 0s if none):
--   "config_get"     flag 1 if a config is stored
--   "config_init"    store the quota unless a config exists; flag 1 if it was written
--   "config_set"     store the quota (create or replace); flag 1 if one was replaced
--   "config_delete"  remove the config; flag 1 if one was removed
-- A config op does not touch the bucket. The next lease or release brings the bucket up to its
-- time under the quota the bucket was written with (h fields r, p, b), then rescales the level
-- to the new quota's units (tokens in the bucket survive a change; fractions are floored) and
-- goes on under the new quota. A full bucket with no leasers stays full (absent reads as
-- full). Outstanding tokens stay counted: if they exceed a new, smaller capacity, the bucket
-- stays empty until they are spent, returned or expired. So a fleet admits at most
-- burst_old + rate_old × t1 + rate_new × t2 (+ burst_new − burst_old if the burst grew while
-- the bucket was full), where t1 runs to the first lease or release after the change and t2
-- from there on — for rates held (rate leases), t1 runs to each rated node's next call (its
-- renewal, at most half its ttl away; or its lease's expiry): a rate granted under the old
-- quota is the node's until then, while the bucket refills at the new rate less the rates
-- held (none if they exceed it). A lease whose min exceeds the effective
-- burst grants nothing (retry 0); the caller's own quota still bounds every argument.
--
-- Conservation. Tokens leased to nodes stay counted in `o` until the node reports them spent
-- (its `held` shrinks), returns them, or its lease expires; refill stops at capacity − o. So
-- level + outstanding ≤ capacity always holds, and the fleet can never spend more than
-- burst + rate × W in any window W — provided nodes stop spending a lease before it expires.
--
-- Releases a lease accounted for. A node takes the tokens it gives back out of what it holds
-- before it sends the release, so its next lease reports them gone (`held`) and they are
-- counted as spent there. A release the store runs after that lease (delayed, or retried
-- after a timeout) must then do nothing: returned again, its tokens would be offered to the
-- fleet a second time while the node still holds its own (and a leaving one would drop the
-- node's new record, its grant and rate uncounted). So a node's lease carries the seq of the
-- last release it has sent (ARGV[15]), the record keeps the larger of it and its own (a new
-- record starts from it), and a release whose seq is not above the record's is ignored — as
-- lua/concurrency.lua's holders do. A lease without it (0, an older client) leaves the
-- record's seq as it was.
--
-- Fairness. A node's share of the rate is proportional to its reported demand (rate × d / D),
-- which gives every node the same acceptance ratio, as one shared bucket would. Each node has a
-- credit that accrues at its share (capped at one horizon's worth, or `min` if larger). Tokens above a reserve of
-- half a horizon of the fleet rate (at most a quarter of the burst, however long a small share's
-- horizon is stretched) are first come, first served; the reserve itself is handed
-- out only against credit. (While the fleet wants more than the rate, credits are drawn as they
-- accrue and the reserve is never spent: it is burst the fleet cannot use. Half a horizon keeps
-- shares as fair as a whole one did and gives the rest back.) A node is served only when it can
-- get a horizon of its share (its step; seven eighths of it will do, since the share moves a
-- little between calls), or its min, or its want if smaller, and every reply says when that will
-- be, so a busy node makes about one call per horizon, not one per token.
--
-- Claims. A node is served only a step (a horizon of its share, or seven eighths of it), so when
-- many nodes take small steps the level may seldom reach a large one: the busiest node, its credit there, would
-- poll while smaller steps take the refill first. So a node that is due (its credit covers its
-- whole step) and is refused only because the level is short leaves a claim: its step is held
-- back from every other leaser (they see the level less the claim, and their retries wait for
-- the refill to cover both) until it comes back for it at its retry time; anonymous takes
-- (per-request decisions) are not held back by it. One claim at a time;
-- it lapses a quarter horizon after that time (never after the claimant's lease), when the
-- claimant is served or no longer due, and when any leaser's record is dropped. A claim only
-- orders who is served first: it never adds a token, so conservation is untouched.
--
-- Rate leases. A node may also ask to hold a rate (ARGV[14]): at most its share, the rate no
-- other leaser holds, and what its counted tokens can carry (below). Shares move between a
-- node's renewals, so the rates held sum to less than the rate, and the rest refills this
-- bucket up to its ceiling, where it is lost; while the bucket sits at its ceiling (when the
-- call starts, before the node reports what it spent), a node may take beyond its share,
-- whatever it asks within the rest and its counted tokens carry. The bucket keeps the sum of
-- held rates R and refills at rate − R, so a node's rate is carved out of the refill, not added
-- to it; the node adds what its rate earns to its local bucket itself (a "drip"), with no call,
-- until its lease expires or it asks again (which ends the old rate and starts the new one at
-- this call's time). The node's counted tokens become its own bucket: it keeps reporting them
-- as held while it holds a rate, drips into them (less one step's worth it never spends, since a
-- drip covers at most one step, a quarter of its horizon, and may run ahead of a continuous
-- bucket by that much), and drips nothing while a call is in flight: the reply pays the flight
-- at the lesser of the old and new rates, which this script counts throughout (up to the old
-- lease's local expiry, before this script's, and into the room its bucket had at the send),
-- and nothing past a lease's local expiry. A sum of token
-- buckets admits at most the sum of their capacities plus the sum of their rates × W, so the
-- fleet still admits at most burst + rate × W. A rate is granted only up to what two steps' worth of the node's
-- counted tokens carry.
--
-- Anonymous callers. A client that takes anonymously (pure mode, another language's client, a
-- node deciding per request) reports no demand and has no record. Taking the whole level while
-- leasers reached the reserve only against credit, such clients were served first (half of a
-- fleet in pure mode beside the other half leasing: 0.997 of their requests against 0.202);
-- beside rate leases, which are carved out of the refill by shares among the leasers, they
-- got only what the rates left. So while a live lease is on record the anonymous callers are
-- one more claimant: the tokens they ask for (granted or not, at most a burst a call) are
-- counted per second in the leasers' bookkeeping; every leaser's share (its credit, the
-- rate it may hold, the share it is told) is its part of the leasers' demand and that
-- anonymous demand together; and an anonymous take sees the level above the reserve of a
-- leaser on the longest automatic horizon (250 ms: half of it at the rate, at most a quarter
-- of the burst), and below it as far as the anonymous callers' credit goes, which accrues at
-- their share and holds at most 250 ms of it (or the call's `min`). A claim is not held back
-- from it: claims order leasers. With no lease on record an anonymous take is exactly one
-- shared bucket's. Approximate: a client's demand is what it asks for, its retries included;
-- the anonymous callers share one credit, first come first served, and each call caps it at
-- 250 ms of their share or its own `min` (a call with a small `min` cuts back what one with
-- a large `min` saved); a leaser's reserve is that of its own horizon (a sixth of the burst
-- with the automatic one where the burst is under 0.75 s of the rate, where theirs is a
-- quarter); a count two windows old reads as none, and the next anonymous call starts afresh
-- with a full credit; a change of quota starts their credit from 0; and while the bucket sits
-- at its ceiling a rate may be granted beyond the share, anonymous demand or not.
--
-- Arithmetic. One token is `scale = period_us / gcd(rate, period_us)` units and every
-- microsecond adds `inc = rate / gcd` units, so the bucket is exact integers below 2^53. Shares
-- and credits use doubles, in the same order of operations as the Rust twin (src/algorithm/token_bucket.rs),
-- so both give bit-identical results. Bad arguments get a "RATELEASE …" error reply, never a
-- Lua runtime error, and nothing is written; invalid stored state reads as absent.

if #KEYS ~= 1 and #KEYS ~= 3 and #KEYS ~= 4 then return bad('keys: expected 1, 3 or 4') end
local op = ARGV[1]
-- The call's numbers by their place in the text protocol (`a2` is ARGV[2], … `a15` ARGV[15]):
-- each argument read with `tonumber` (nil if it is not a number), or a packed node call's
-- numbers as they come (see "Packed node calls" above), so one check serves both. The checks
-- are written out, not calls of `int_val`: a function call costs Redis's Lua more than the
-- check itself, and a lease checks twelve numbers. (A check `x >= lo and x <= hi and x % 1 ==
-- 0` also refuses NaN and ±inf, as `int_val` does; `+ 0` turns -0 into 0 where 0 is allowed.)
local a2, a3, a4, a5, a6, a7, a9, a10, a11, a12, a14, a15
-- The node id ("" anonymous) and what to do without a stored config (ARGV[8] and ARGV[13]).
local node, unconfigured
-- Whether the call gives its own time (else the server's clock), asks to hold a rate, and
-- (a node's lease) says which release it sent last.
local explicit_now, rate_asked, seq_sent
local packed_call = op == 'node_lease' or op == 'node_release'
-- A packed call's arguments and its replies (a node's lease, and anything else).
local PACKED, REPLY11, REPLY9 = '<dddddddddddd', '<ddddddddddd', '<ddddddddd'
if packed_call then
  if #KEYS ~= 4 then return bad('keys: a packed call sends 4') end
  local p = ARGV[2]
  if type(p) ~= 'string' or #p ~= 96 then return bad('packed') end
  a2, a3, a4, a5, a6, a7, a9, a10, a11, a12, a14, a15 = struct.unpack(PACKED, p)
  if op == 'node_lease' then op = 'lease' else op = 'release' end
  node, unconfigured = ARGV[3], ARGV[4]
  if node == nil or node == '' then return bad('node') end
  explicit_now, rate_asked, seq_sent = a7 ~= -1, a14 ~= -1, a15 ~= -1
else
  a2, a3, a4, a5, a6 = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]),
    tonumber(ARGV[5]), tonumber(ARGV[6])
  explicit_now = not (ARGV[7] == nil or ARGV[7] == '')
  if explicit_now then a7 = tonumber(ARGV[7]) end
  node, unconfigured = ARGV[8] or '', ARGV[13]
  rate_asked = not (ARGV[14] == nil or ARGV[14] == '')
  seq_sent = not (ARGV[15] == nil or ARGV[15] == '')
end
local config_op = op == 'config_get' or op == 'config_init' or op == 'config_set'
  or op == 'config_delete'
if op ~= 'lease' and op ~= 'release'
    and not (config_op and (#KEYS == 4 or (#KEYS == 1 and op == 'config_get'))) then
  return bad('op')
end
-- Checked whether or not a config is stored: a typo that worked while one was would fail
-- every call once it was deleted.
if #KEYS == 4 and not config_op and unconfigured ~= nil and unconfigured ~= ''
    and unconfigured ~= 'caller' and unconfigured ~= 'none' then
  return bad('unconfigured')
end
-- The config hash: the fourth key, or the only one of a config read.
local CONFIG = KEYS[4]
if config_op and #KEYS == 1 then CONFIG = KEYS[1] end

-- The caller's quota and the call's arguments, checked before anything else is defined: a
-- pure-mode decision (below) needs no more, and every function a script defines is built
-- anew on each call (a closure, with its upvalues found and closed), which for the six the
-- general path defines before its bucket is loaded cost more than the decision's arithmetic.
-- Config operations take no quota, time or node (their ARGV[2..4] are checked by init/set).
local rate, period, burst, scale, inc, cap
if op ~= 'config_get' and op ~= 'config_delete' then
  rate, period, burst = a2, a3, a4
  if not (rate and rate >= 1 and rate <= MAX and rate % 1 == 0) then return bad('rate') end
  if not (period and period >= 1 and period <= MAX and period % 1 == 0) then
    return bad('period_us')
  end
  if not (burst and burst >= 1 and burst <= MAX and burst % 1 == 0) then return bad('burst') end
  scale, inc, cap = fixed_point(rate, period, burst)
  if not scale then return bad('burst') end
end

local want, min, now
local held, demand, horizon, ttl, seq, leaving, want_rate
if not config_op then
  want = a5
  if op == 'lease' then
    if not (want and want >= 1 and want <= MAX and want % 1 == 0) then return bad('want') end
    min = a6
    if not (min and min >= 1 and min <= want and min % 1 == 0) or min > burst then
      return bad('min')
    end
  else
    if not (want and want >= 0 and want <= MAX and want % 1 == 0) then return bad('tokens') end
    want = want + 0
  end

  -- The server's clock ("" or, packed, -1), else a time given by the caller.
  if explicit_now then
    now = a7
    if not (now and now >= 0 and now <= MAX_TIME and now % 1 == 0) then return bad('now_us') end
    now = now + 0
  else
    now = server_now()
  end

  if #node > 128 then return bad('node') end
  if #KEYS == 1 and node ~= '' then return bad('keys: a leaser sends 3 or 4') end
  if node ~= '' then
    if not packed_call then
      a9, a10, a11, a12 = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]),
        tonumber(ARGV[12])
      if rate_asked then a14 = tonumber(ARGV[14]) end
      if seq_sent then a15 = tonumber(ARGV[15]) end
    end
    if op == 'lease' then
      held, demand, horizon, ttl = a9, a10, a11, a12
      if not (held and held >= 0 and held <= MAX and held % 1 == 0) then return bad('held') end
      if not (demand and demand >= 0 and demand <= MAX and demand % 1 == 0) then
        return bad('demand')
      end
      if not (horizon and horizon >= 1 and horizon <= MAX and horizon % 1 == 0) then
        return bad('horizon_us')
      end
      if not (ttl and ttl >= 1 and ttl <= MAX and ttl % 1 == 0) then return bad('ttl_us') end
      held, demand = held + 0, demand + 0
      if rate_asked then
        want_rate = a14
        if not (want_rate and want_rate >= 0 and want_rate <= MAX and want_rate % 1 == 0) then
          return bad('rate_mtps')
        end
        want_rate = want_rate + 0
      end
      -- The last release the node sent (0: none): see "Releases a lease accounted for".
      seq = 0
      if seq_sent then
        seq = a15
        if not (seq and seq >= 0 and seq <= MAX and seq % 1 == 0) then
          return bad('release_seq')
        end
        seq = seq + 0
      end
    else
      seq, leaving = a9, a10
      if not (seq and seq >= 0 and seq <= MAX and seq % 1 == 0) then return bad('seq') end
      if not (leaving == 0 or leaving == 1) then return bad('leaving') end
      seq, leaving = seq + 0, leaving + 0
    end
  end
end

local STATE, STATE_LEN = '<Bddddddddd', 73
-- The bucket while leasers hold rates: format 2, the same fields and R after them.
local STATE2, STATE2_LEN = '<Bdddddddddd', 81

-- An anonymous lease from a bucket at `level`: all or nothing below `min`, at most `want`.
-- Returns the tokens granted, the level left and the units a lease of `min` still lacks (0 or
-- less: none), for the caller to turn into a wait at the refill it knows. Built for anonymous
-- calls only: it captures four locals, which a node's call would pay for and never use.
local take_anonymous
if node == '' then
  take_anonymous = function(level)
    local granted = 0
    local whole = floor_div(level, scale)
    if whole >= min then
      granted = math.min(whole, want)
      level = level - granted * scale
    end
    return granted, level, min * scale - level
  end
end

-- A pure-mode decision: an anonymous lease under the caller's quota (no config key) on a bucket
-- written under this very quota with no leaser on record. It is the one call a pure-mode
-- limiter makes per request, so it runs here, before the general path's machinery is built
-- (leasers, rescaling, old formats, rate leases and the closures below): building those
-- functions cost a pure decision more than its own arithmetic (14 % of the call). It does exactly what the general path does for such a call — the
-- same operations in the same order (load, refill, take, store) — and
-- the differential tests hold both to the Rust twin; anything else falls through to it.
if op == 'lease' and node == '' and #KEYS < 4 then
  local raw = redis.pcall('GET', KEYS[1])
  if type(raw) == 'string' and #raw == STATE_LEN then
    local f, v, s, t, o, d, r, p, b, x = struct.unpack(STATE, raw)
    if f == 1 and x == 0 and r == rate and p == period and b == burst and s == scale
        and v >= 0 and v <= MAX and v % 1 == 0 and t >= 0 and t <= MAX_TIME and t % 1 == 0
        and o >= 0 and o <= MAX and o % 1 == 0 and d >= 0 and d <= MAX and d % 1 == 0 then
      local out = mmin(o, burst)
      local top = mmax(0, cap - out * scale)
      local level = mmin(v, top)
      if now > t then
        local room = top - level
        if room > 0 then
          if now - t >= ceil_div(room, inc) then level = top else level = level + (now - t) * inc end
        end
        t = now
      end
      local granted, need
      granted, level, need = take_anonymous(level)
      -- No leaser holds a rate: the whole rate refills.
      local retry = 0
      if need > 0 then retry = ceil_div(need, inc) end
      local reset = ceil_div(top - level, inc)
      if level >= cap and out == 0 then
        redis.call('DEL', unpack(KEYS))
      else
        -- Kept until it would be full (in doubles, rounded up: a millisecond off at worst,
        -- within the slack); a count of ms as text by Lua's own conversion (see int_str).
        local keep = mceil((cap - level) / (inc * 1000))
        redis.call('SET', KEYS[1], struct.pack(STATE, 1, level, scale, t, out, d, rate, period,
          burst, 0), 'PX', (keep + SLACK_MS) .. '')
      end
      return { granted, floor_div(level, scale), retry, reset, 0 }
    end
  end
end

-- A quota from three values of any kind (stored ones), or nil: each in 1 ..= 2^52, and
-- burst × scale ≤ 2^52.
local function quota_of(r, p, b)
  r, p, b = int_val(r, 1, MAX), int_val(p, 1, MAX), int_val(b, 1, MAX)
  if not (r and p and b) then return nil end
  local sc, i, c = fixed_point(r, p, b)
  if not sc then return nil end
  -- Every field in the constructor: one allocation, no rehash.
  return { rate = r, period = p, burst = b, scale = sc, inc = i, cap = c }
end

-- The stored config: a quota (nil if none or invalid) and whether one is stored. `caller`, if
-- given, is returned as it is when the stored fields are the very strings the caller sent (as
-- they are once a client follows the config): no parse, no new table. (The caller's numbers
-- are read from `caller`, not captured: see `fill_time` on upvalues.)
local function stored_config(caller)
  local c = redis.pcall('HMGET', CONFIG, 'rate', 'period_us', 'burst')
  -- Not a hash (a wrong key, say): an invalid config, never a runtime error.
  if c.err then return nil, true end
  if not c[1] and not c[2] and not c[3] then return nil, false end
  if caller then
    -- Text sent as the very strings stored: equal as they are; packed, as numbers.
    if packed_call then
      if tonumber(c[1]) == caller.rate and tonumber(c[2]) == caller.period
          and tonumber(c[3]) == caller.burst then
        return caller, true
      end
    elseif c[1] == ARGV[2] and c[2] == ARGV[3] and c[3] == ARGV[4] then
      return caller, true
    end
  end
  return quota_of(c[1], c[2], c[3]), true
end

if op == 'config_get' or op == 'config_delete' then
  local c, present = stored_config()
  if present and op == 'config_delete' then redis.call('DEL', CONFIG) end
  if not c then return { 0, 0, 0, present and 1 or 0 } end
  return { c.rate, c.period, c.burst, 1 }
end

local caller = { rate = rate, period = period, burst = burst, scale = scale, inc = inc, cap = cap }

if config_op then
  local c, present = stored_config()
  if op == 'config_init' and present then
    if not c then return { 0, 0, 0, 0 } end
    return { c.rate, c.period, c.burst, 0 }
  end
  redis.call('DEL', CONFIG)
  redis.call('HSET', CONFIG, 'rate', int_str(rate), 'period_us', int_str(period),
    'burst', int_str(burst))
  local flag = 0
  if op == 'config_init' or present then flag = 1 end
  return { rate, period, burst, flag }
end

-- The quota this call runs under: the stored config, else the caller's (or nothing at all).
local q, source = caller, 0
if #KEYS == 4 then
  local c, present = stored_config(caller)
  if present and not c then return redis.error_reply('RATELEASE invalid stored config') end
  if c then
    q, source = c, 1
  elseif unconfigured == 'none' then
    -- (A 4-key reply, packed or not: see the end of the script.)
    if packed_call then
      if held then return struct.pack(REPLY11, 0, 0, 0, 0, 0, rate, period, burst, 2, 0, 0) end
      return struct.pack(REPLY9, 0, 0, 0, 0, 0, rate, period, burst, 2)
    end
    if held then return { 0, 0, 0, 0, 0, rate, period, burst, 2, 0, 0 } end
    return { 0, 0, 0, 0, 0, rate, period, burst, 2 }
  end
end
-- (Assigned, not declared again: `take_anonymous`, above, works in these units.)
rate, period, burst = q.rate, q.period, q.burst
scale, inc, cap = q.scale, q.inc, q.cap
-- Rate held by leasers (rate leases), millitokens per second: the bucket refills at the rate
-- less this. Set when the bucket is loaded (never on the pure-mode decision above: no leasers).
local res = 0

-- Microseconds until a bucket under quota `p` gains `units` while `res` is held by leasers, but
-- never more than RESERVED_RETRY_US beyond the time at the whole rate.
--
-- (This function writes its constant in place and calls `math.min` rather than `mmin`, as do
-- the others that run once or twice a call: a value a function takes from outside is an
-- upvalue, which costs every call of the script an allocation and a search of the open
-- upvalues as the function is built — more than a function that runs once saves by it.)
local function fill_time(p, units)
  if res == 0 then return ceil_div(units, p.inc) end
  if units == 0 then return 0 end
  -- Longest a retry waits beyond the time at the whole rate while leasers hold part of it:
  -- rate leases may be renewed smaller any time, so a wait from the refill they leave now
  -- could sleep through that.
  local RESERVED_RETRY_US = 100000
  local most = ceil_div(units, p.inc) + RESERVED_RETRY_US
  -- Units per µs left to the bucket (0 or less: none), written out here and in `refill`: as a
  -- function it cost more to build and call than its arithmetic (see the note above).
  local eff = p.inc - res * p.scale / 1e9
  if eff <= 0 then return most end
  return math.min(math.ceil(units / eff), most)
end

-- The highest level the bucket may reach under quota `p`: capacity − outstanding, ≥ 0. (Under
-- the call's quota, where a node's lease needs it and for every call's reset, written out as
-- `mmax(0, cap - out * scale)`: a function call costs Redis's Lua more than its arithmetic,
-- see `fill_time`.)
local function ceiling(p, o)
  return mmax(0, p.cap - o * p.scale)
end

-- `v` units of `from` per token in units of `to` per token, floored, at most `b` whole tokens;
-- the fraction of a token never rounds up to a whole one.
local function rescale(v, from, to, b)
  if from == to then return v end
  local whole = floor_div(v, from)
  local frac = math.min(math.floor((v - whole * from) * to / from), to - 1)
  return math.min(whole, b) * to + frac
end

-- Load; a bucket that is not valid reads as full with nothing outstanding. A bucket written
-- under another quota (`first`) runs to `now` under it before it is rescaled to `q`.
--
-- The bucket is one string: a format byte (1), then nine little-endian doubles — level v (in
-- 1/scale token units), scale s, time t (µs), outstanding o, demand d, the quota r p b it was
-- written under, and x, the latest lease expiry on record in µs (0: no leaser records, so a
-- pure-mode call skips the leasers' keys altogether). While leasers hold rates (R > 0) the
-- string is format 2: the same fields, then R (so a bucket without rate leases is written as
-- earlier versions wrote it). Packed, not printed: turning a number
-- into text costs Redis's Lua more than a command does, and one GET and one SET … PX are
-- the cheapest read and write there are. A bucket stored as a hash (v s t o d r p b fields, as
-- earlier versions wrote it) is read once and replaced.
local level, ts, out, dsum = cap, now, 0, 0
local first = q
-- The latest lease expiry on record: nil while unknown (leaser records may exist).
local latest = nil
local v, s, t, o, d, r, p, b, x
local raw = redis.pcall('GET', KEYS[1])
local packed = type(raw) == 'string' and (#raw == STATE_LEN or #raw == STATE2_LEN)
if packed then
  local format, rr
  if #raw == STATE_LEN then
    format, v, s, t, o, d, r, p, b, x = struct.unpack(STATE, raw)
    rr = 0
  else
    format, v, s, t, o, d, r, p, b, x, rr = struct.unpack(STATE2, raw)
    if format == 2 then format = 1 else format = 0 end
  end
  -- Numbers already, so int_val's checks written out (one comparison chain, no calls): every
  -- field an integer in range; anything else (or another format) reads as absent.
  if not (format == 1 and rr >= 0 and rr <= MAX and rr % 1 == 0 and v >= 0 and v <= MAX and v % 1 == 0 and s >= 1 and s <= MAX
      and s % 1 == 0 and t >= 0 and t <= MAX_TIME and t % 1 == 0 and o >= 0 and o <= MAX
      and o % 1 == 0 and d >= 0 and d <= MAX and d % 1 == 0) then
    v = nil
  end
  if not (x >= 0 and x <= MAX_TIME and x % 1 == 0) then x = nil end
  if v then res = rr end
elseif type(raw) == 'table' and raw.err ~= nil then
  -- Only a key of another type is read as absent (WRONGTYPE: a hash, say); any other error
  -- (a refused command, say) fails the call, never reads as a full bucket. (Built here, where
  -- it is used, not on every call.)
  local function wrong_type(reply)
    return type(reply) == 'table' and reply.err ~= nil
      and string.sub(reply.err, 1, 9) == 'WRONGTYPE'
  end
  if not wrong_type(raw) then return raw end
  local h = redis.pcall('HMGET', KEYS[1], 'v', 's', 't', 'o', 'd', 'r', 'p', 'b')
  if type(h) == 'table' and h.err == nil then
    v, s, t, o, d, r, p, b = h[1], h[2], h[3], h[4] or 0, h[5] or 0, h[6], h[7], h[8]
  elseif not wrong_type(h) then
    return h
  end
end
if not packed then
  v, s, t = int_val(v, 0, MAX), int_val(s, 1, MAX), int_val(t, 0, MAX_TIME)
  o, d = int_val(o, 0, MAX), int_val(d, 0, MAX)
  x = int_val(x, 0, MAX_TIME)
end
if v and s and t and o and d then
  -- Most buckets were written under the quota of this call: no need to check it again.
  local w = q
  if r ~= q.rate or p ~= q.period or b ~= q.burst then w = quota_of(r, p, b) end
  if w and w.scale == s then first = w end
  level = v
  if s ~= first.scale then level = rescale(v, s, first.scale, first.burst) end
  -- Not cut to a burst: after the burst shrank, tokens held above it are still counted.
  out = o
  level = mmin(level, ceiling(first, out))
  ts = t
  dsum = d
  latest = x
end
if #KEYS == 1 then
  -- A bucket that does not exist has no live leasers: it is kept past the latest lease
  -- expiry on record, so whatever records its leasers' keys still hold (they may outlive it)
  -- are of expired leases, which the next leaser's call drops.
  if raw == false then latest = 0 end
  if latest ~= 0 then return { 0 } end
end
local leasers = latest ~= 0 or node ~= ''

-- Lazy refill under quota `p` up to time `to`, never above capacity − outstanding, never
-- backwards; at the rate the leasers' rate leases (`res`) leave to the bucket: exact with none,
-- else the reserved units rounded up and the gain down.
local function refill(p, to)
  if to > ts then
    local room = ceiling(p, out) - level
    if room > 0 then
      local dt = to - ts
      if res == 0 then
        if dt >= ceil_div(room, p.inc) then level = level + room else level = level + dt * p.inc end
      else
        -- (Units per µs left to the bucket, as in `fill_time`.)
        local eff = p.inc - res * p.scale / 1e9
        if eff > 0 then
          if dt >= math.ceil(room / eff) then
            level = level + room
          else
            level = level + math.max(0, math.min(room,
              math.floor(dt * p.inc - math.ceil(dt * res * p.scale / 1e9))))
          end
        end
      end
    end
    ts = to
  end
end

-- A leaser record: outstanding tokens, demand, credit units, credit time, expiry, release seq;
-- packed like the bucket (a format byte 1, six little-endian doubles); while it holds a rate,
-- format 2 with its rate (mtps) after them. A record written as text ("o d c tc exp rseq", as
-- earlier versions did) is still read, so its tokens stay counted.
-- (The formats are written where they are used, '<Bdddddd' of 49 bytes and '<Bddddddd' of 57:
-- see `fill_time` on upvalues.)
local function parse(raw)
  if type(raw) ~= 'string' then return nil end
  if #raw == 49 or #raw == 57 then
    local fmt, o, d, c, tc, exp, rseq, rt
    if #raw == 49 then
      fmt, o, d, c, tc, exp, rseq = struct.unpack('<Bdddddd', raw)
      rt = 0
    else
      fmt, o, d, c, tc, exp, rseq, rt = struct.unpack('<Bddddddd', raw)
      if fmt == 2 then fmt = 1 else fmt = 0 end
    end
    if fmt == 1 then
      -- Numbers already: int_val's checks written out, as for the bucket.
      if o >= 0 and o <= MAX and o % 1 == 0 and d >= 0 and d <= MAX and d % 1 == 0
          and c >= 0 and c <= MAX and c % 1 == 0 and tc >= 0 and tc <= MAX_TIME and tc % 1 == 0
          and exp >= 0 and exp <= MAX_TIME and exp % 1 == 0 and rseq >= 0 and rseq <= MAX
          and rseq % 1 == 0 and rt >= 0 and rt <= MAX and rt % 1 == 0 then
        return { o = o, d = d, c = c, tc = tc, exp = exp, rseq = rseq, rt = rt }
      end
      return nil
    end
  end
  local f = text_fields(raw, 6)
  if not f then return nil end
  local r = {
    o = int_val(f[1], 0, MAX), d = int_val(f[2], 0, MAX), c = int_val(f[3], 0, MAX),
    tc = int_val(f[4], 0, MAX_TIME), exp = int_val(f[5], 0, MAX_TIME), rseq = int_val(f[6], 0, MAX),
    rt = 0,
  }
  if not (r.o and r.d and r.c and r.tc and r.exp and r.rseq) then return nil end
  return r
end

local function encode(r)
  if r.rt == 0 then return struct.pack('<Bdddddd', 1, r.o, r.d, r.c, r.tc, r.exp, r.rseq) end
  return struct.pack('<Bddddddd', 2, r.o, r.d, r.c, r.tc, r.exp, r.rseq, r.rt)
end

-- The leasers' bookkeeping, in the leasers hash under the empty field name, which no node id
-- can be: a format byte (2, or 3 and 4: below), then as little-endian doubles the number of leasers on record (-1:
-- not known), a time before which no lease on record expires (µs) and the pending claim (see
-- "Claims" above): its units and when it lapses (µs; 0 0: none), then the claimant's id. It
-- spares most calls two commands: the search for expired leases (none is due before that time)
-- and the count of leasers (ZADD and ZREM tell how it changes). A node's call reads it with its
-- own record, in one command. A field of format 1 is a claim alone, as earlier versions wrote
-- it: then the search runs and the leasers are counted. Earlier versions read format 2 as "no
-- claim", delete it when they drop a leaser, add leasers without counting them or lowering
-- that time, and set the leasers' keys' expiry to their bucket's on every call; so whenever
-- a call renews the keys' expiry (below: about once per slack on a busy bucket, and at once
-- after an earlier version shortened it) it counts the leasers again and leaves the next call
-- to search, and a count that would fall below zero reads as not known. What a rolling
-- upgrade puts out of step lasts until the next renewal.
-- The claim is used by a node's lease only, and only until it lapses: claims order leasers,
-- an anonymous take (a per-request decision) is never held back by one.
-- Format 4 adds, before the claimant's id, the anonymous callers beside leasers (see
-- "Anonymous callers" above): when the window of their demand began (µs), the tokens asked
-- in it and in the window before, their credit (units) and when it last accrued (µs). It is
-- written only while there is some demand; earlier versions read it as bookkeeping not known
-- (they count and search again, and write format 2 back). Format 3, written by the version
-- before, is the same without the credit (read as a credit of 0 gained since time 0: a full
-- one at the next anonymous call).
local META, META_LEN, CLAIM, CLAIM_LEN = '<Bdddd', 33, '<Bdd', 17
local META3, META3_LEN = '<Bddddddd', 57
local META4, META4_LEN = '<Bddddddddd', 73
-- The window anonymous demand is counted over (µs): its count × 1000 is millitokens/s.
local ANON_WINDOW_US = 1000000
-- The horizon anonymous callers are taken to lease at (µs): the longest automatic horizon
-- (ANON_HORIZON_US in the Rust twin).
local ANON_HORIZON_US = 250000
local count, earliest, claim = nil, nil, nil
-- Anonymous demand: window start (µs), tokens asked in it, tokens asked in the one before;
-- the anonymous callers' credit (units) and when it last accrued (µs).
local anon_at, anon_cur, anon_prev, anon_credit, anon_tc = 0, 0, 0, 0, 0
-- `known`: the field was of format 2, 3 or 4 (else the keys' expiry is set and the leasers
-- counted).
local meta_raw, meta_dirty, known = nil, false, false
-- The calling node's record as read with the bookkeeping (nil once its lease is found expired).
local own_raw = nil
if leasers then
  if node ~= '' then
    local got = redis.call('HMGET', KEYS[2], node, '')
    own_raw, meta_raw = got[1], got[2]
  else
    meta_raw = redis.call('HGET', KEYS[2], '')
  end
  -- Read in place, not by a function: every function is a closure built anew on each call.
  local fmt, n, e, units, untl, id, aa, ac, ap
  if type(meta_raw) == 'string' then fmt = string.byte(meta_raw) end
  if fmt == 2 and #meta_raw >= META_LEN and #meta_raw <= META_LEN + 128 then
    fmt, n, e, units, untl = struct.unpack(META, meta_raw)
    if n >= -1 and n <= MAX and n % 1 == 0 and e >= 0 and e <= MAX_TIME and e % 1 == 0 then
      if n >= 0 then count = n end
      earliest, known = e, true
      id = string.sub(meta_raw, META_LEN + 1)
    end
  elseif (fmt == 3 and #meta_raw >= META3_LEN and #meta_raw <= META3_LEN + 128)
      or (fmt == 4 and #meta_raw >= META4_LEN and #meta_raw <= META4_LEN + 128) then
    local head, ak, at = META3_LEN, 0, 0
    if fmt == 3 then
      fmt, n, e, units, untl, aa, ac, ap = struct.unpack(META3, meta_raw)
    else
      fmt, n, e, units, untl, aa, ac, ap, ak, at = struct.unpack(META4, meta_raw)
      head = META4_LEN
    end
    if n >= -1 and n <= MAX and n % 1 == 0 and e >= 0 and e <= MAX_TIME and e % 1 == 0 then
      if n >= 0 then count = n end
      earliest, known = e, true
      id = string.sub(meta_raw, head + 1)
      -- Anonymous demand that is not valid, or two windows old, reads as none (and is not
      -- written again: format 2 then); a credit that is not valid, as none.
      if aa >= 0 and aa <= MAX_TIME and aa % 1 == 0 and ac >= 0 and ac <= MAX and ac % 1 == 0
          and ap >= 0 and ap <= MAX and ap % 1 == 0 and now < aa + 2 * ANON_WINDOW_US then
        anon_at, anon_cur, anon_prev = aa, ac, ap
        if ak >= 0 and ak <= MAX and ak % 1 == 0 and at >= 0 and at <= MAX_TIME and at % 1 == 0 then
          anon_credit, anon_tc = ak, at
        end
      end
    end
  elseif fmt == 1 and #meta_raw > CLAIM_LEN and #meta_raw <= CLAIM_LEN + 128 then
    fmt, units, untl = struct.unpack(CLAIM, meta_raw)
    id = string.sub(meta_raw, CLAIM_LEN + 1)
  end
  if id and id ~= '' and units >= 1 and units <= MAX and units % 1 == 0 and untl > now
      and untl <= MAX_TIME and untl % 1 == 0 then
    claim = { node = id, units = units, untl = untl }
  end
end

-- Leasers on record (members of the expiry set): as the bookkeeping counts them, else counted,
-- or nil if the server refuses to count them (an ACL written before the script used ZCARD): a
-- refusal must not fail a call after it has written, so it is caught and read as "not known".
local function count_leasers()
  if count then return count end
  local n = redis.pcall('ZCARD', KEYS[3])
  if type(n) == 'number' then count = n end
  return count
end

-- Drop a leaser: what it still had outstanding is gone (spent, or lost with a crashed node).
-- The claim goes with it (its claimant may be the one gone; a due node claims again). Built
-- only by a call that may drop one — that looks for expired leases, or a node's release as it
-- leaves — as it takes eight values from outside (see `fill_time` on upvalues).
local forgot = false
local search = leasers and (earliest == nil or now >= earliest)
local forget
if search or leaving == 1 then
  forget = function(id, r)
    forgot = true
    if r then
      out = math.max(0, out - r.o)
      dsum = math.max(0, dsum - r.d)
      res = math.max(0, res - r.rt)
    end
    if id == node then own_raw = nil end
    -- (The bookkeeping is written anew at the end of a call that forgot a leaser.)
    claim = nil
    redis.call('HDEL', KEYS[2], id)
    local gone = redis.call('ZREM', KEYS[3], id)
    if count then
      count = count - gone
      if count < 0 then count = nil end
    end
  end
end

-- Expired leases, in expiry order, each freeing room at its own expiry time; the first one
-- left tells when the next can be due. Not looked for before then. The earliest entry is read
-- first: most searches find none due (one command), and when some are, all go in one more
-- (however many a stopped fleet left) before the next earliest is read.
-- Whether a live lease is on record once expired ones are dropped: an anonymous take beside
-- leasers is one more claimant of the rate (below).
local live = leasers
if search then
  earliest = MAX_TIME
  meta_dirty = true
  local head = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if #head > 0 and tonumber(head[2]) <= now then
    local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', int_str(now), 'WITHSCORES')
    for i = 1, #due, 2 do
      refill(first, tonumber(due[i + 1]))
      forget(due[i], parse(redis.call('HGET', KEYS[2], due[i])))
    end
    head = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  end
  if #head > 0 then earliest = tonumber(head[2]) else live = false end
end
refill(first, now)
if first ~= q then
  -- A full bucket with no leasers is not stored (absent reads as full), so it stays full
  -- across a change, as it would once expired; anything else keeps its tokens.
  -- (No leaser on record, latest == 0, is a zset with no members: no need to count them.)
  if level >= first.cap and out == 0 and (latest == 0 or count_leasers() == 0) then
    level = cap
  else
    level = mmin(rescale(level, first.scale, scale, burst), ceiling(q, out))
  end
  -- A claim is in the old quota's units, and so is the anonymous callers' credit: they gain
  -- it again from here.
  if claim then
    claim = nil
    meta_dirty = true
  end
  if anon_cur > 0 or anon_prev > 0 then
    anon_credit, anon_tc = 0, now
    meta_dirty = true
  end
end

local granted, retry, share, held_rate = 0, 0, 0, 0
-- Whether anonymous callers ask beside the leasers: a node's lease counts them as one more
-- claimant in its reply (see the reply's `leasers`).
local anon_asking = false
-- The expiry this call gave a lease, if any; the node's record to write, if any; whether the
-- node is new to the expiry set.
local expiry, record, added = nil, nil, 0
if op == 'lease' and min > burst then
  -- Above the effective burst (it shrank below the caller's): never grantable.
elseif op == 'lease' and node == '' and not live then
  -- No leaser: the whole level, exactly as one shared bucket.
  local need
  granted, level, need = take_anonymous(level)
  if need > 0 then retry = fill_time(q, need) end
elseif op == 'lease' and node == '' then
  -- Beside leasers (see "Anonymous callers"): one more claimant, with the demand the anonymous
  -- callers ask for, granted or not (at most a burst a call: one huge ask must not take every
  -- share away), and the reserve of a leaser on the longest automatic horizon, reached
  -- against their credit. A claim is not held back from it: claims order leasers.
  local fresh = anon_cur == 0 and anon_prev == 0
  if now >= anon_at + ANON_WINDOW_US then
    if now < anon_at + 2 * ANON_WINDOW_US then anon_prev = anon_cur else anon_prev = 0 end
    anon_cur, anon_at = 0, now
  end
  anon_cur = mmin(anon_cur + mmin(want, burst), MAX)
  meta_dirty = true
  local a = mmax(anon_cur, anon_prev) * 1000
  local rho = inc * a / (dsum + a)
  local ccap = mmin(mmax(mfloor(rho * ANON_HORIZON_US), min * scale), cap)
  -- Gained for the time since it last gained a unit: callers a microsecond or two apart each
  -- gain less than a unit at a high rate, and moving its time on without a unit would lose it.
  local gain = 0
  if now > anon_tc then gain = mfloor(rho * (now - anon_tc)) end
  if fresh then
    anon_credit, anon_tc = ccap, now
  elseif gain > 0 then
    anon_credit, anon_tc = mmin(anon_credit + gain, ccap), now
  else
    anon_credit = mmin(anon_credit, ccap)
  end
  local reserve = mmin(mfloor(rate * ANON_HORIZON_US / period / 2), mfloor(burst / 4))
  local whole = floor_div(level, scale)
  local free = mmax(0, whole - reserve)
  local avail = free + mmin(whole - free, floor_div(anon_credit, scale))
  if avail >= min then
    granted = mmin(want, avail)
    level = level - granted * scale
    anon_credit = mmax(0, anon_credit - mmax(0, granted - free) * scale)
    free = mmax(0, floor_div(level, scale) - reserve)
  end
  -- When a take of `min` could succeed: once the level holds it, and where the level above
  -- the reserve does not, once the credit covers the rest or the level the reserve too,
  -- whichever is first.
  if min * scale > level then retry = fill_time(q, min * scale - level) end
  if free < min then
    local credit_short = (min - free) * scale - anon_credit
    if credit_short > 0 then
      local wait = fill_time(q, mmax(0, (reserve + min) * scale - level))
      if rho > 0 then wait = mmin(wait, mceil(credit_short / rho)) end
      if wait > retry then retry = mmin(wait, MAX_TIME) end
    end
  end
elseif op == 'lease' then
  -- Whether the bucket sits at its ceiling (its refill lost) before this call reports what the
  -- node spent: a rate lease may then take beyond the share (below).
  local at_ceiling = level >= mmax(0, cap - out * scale)
  local r = parse(own_raw)
  local fresh = r == nil
  if fresh then r = { o = 0, d = 0, c = 0, tc = now, exp = 0, rseq = 0, rt = 0 } end
  -- What the node no longer holds, it spent. The rate it held ends here (a new one may start
  -- below).
  if held > r.o then held = r.o end
  out = mmax(0, out - (r.o - held))
  r.o = held
  -- Releases it sent up to here are in `held` already: one the store runs after this lease
  -- is ignored (see "Releases a lease accounted for").
  if seq > r.rseq then r.rseq = seq end
  res = mmax(0, res - r.rt)
  local old_rate = r.rt
  r.rt = 0
  dsum = mmin(mmax(0, dsum - r.d) + demand, MAX)
  r.d = demand
  -- Its share of the rate, in units per µs, among the leasers' demand and the anonymous
  -- callers' (see "Anonymous callers": what they asked for in the last whole window, or in
  -- this one if more, as millitokens per second; none once two windows have passed without
  -- any), and its credit.
  local anon = 0
  if now < anon_at + ANON_WINDOW_US then
    anon = mmax(anon_cur, anon_prev)
  elseif now < anon_at + 2 * ANON_WINDOW_US then
    anon = anon_cur
  end
  anon_asking = anon > 0
  local whole_share = 0
  if demand > 0 then whole_share = inc * demand / (dsum + anon * 1000) end
  share = mmin(mfloor(whole_share * 1e9 / scale), MAX)
  -- What a rate lease brought it is its share already: credit, and the size a grant must
  -- reach, go by the rest of its share.
  local rho = mmax(0, whole_share - old_rate * scale / 1e9)
  -- At least `min`, so a request larger than a horizon of share waits longer, not forever.
  local ccap = mmin(mmax(mfloor(rho * horizon), min * scale), cap)
  if fresh then
    r.c = ccap
  elseif now > r.tc then
    -- For the whole time since its last call: a share whose horizon holds less than `min`
    -- would otherwise gain under a token a call, and need several calls for one.
    r.c = mmin(r.c + mfloor(rho * (now - r.tc)), ccap)
  else
    r.c = mmin(r.c, ccap)
  end
  if now > r.tc then r.tc = now end
  -- Another node's claim is held back from this one (its own is not).
  local mine = claim ~= nil and claim.node == node
  local hold = 0
  if claim and not mine then hold = claim.units end
  -- Above the reserve: first come, first served. The reserve: against credit. Half the caller's
  -- horizon of the rate, at most burst / 4 (RESERVE_PARTS in the Rust twin): bounded for the
  -- fleet, however long a small share's horizon is stretched.
  local whole = floor_div(mmax(0, level - hold), scale)
  local reserve = mmin(mfloor(rate * horizon / period / 2), mfloor(burst / 4))
  local free = mmax(0, whole - reserve)
  local avail = free + mmin(whole - free, floor_div(r.c, scale))
  local floor_tokens = mmin(mfloor(rho * horizon / scale), want, burst)
  local need = mmax(min, floor_tokens)
  -- Served once it can get seven eighths of its step (rounded down; exact in doubles): its share
  -- (and with it its step) moves a little between calls, and a refusal for the difference costs
  -- a call for nothing. A refused node is still told when its whole step is there: coming back
  -- for seven eighths would serve it smaller steps, more often, than first-come takers of the
  -- level above the reserve.
  -- (Divided by a power of two, an integer below 2^53 is exact in a double, so `mfloor` of it
  -- is the exact quotient: no `floor_div`, whose call costs more than the division.)
  local enough = mmax(min, floor_tokens - mfloor((floor_tokens + 7) / 8))
  if avail >= enough then
    granted = mmin(want, avail)
    level = level - granted * scale
    out = out + granted
    r.o = r.o + granted
    r.c = mmax(0, r.c - mmax(0, granted - free) * scale)
    whole = floor_div(mmax(0, level - hold), scale)
    free = mmax(0, whole - reserve)
    -- The next ask will be for about the node's whole target (what it held plus what it
    -- wanted), not for what was left of this one: pace it for that.
    need = mmax(min, mmin(mfloor(rho * horizon / scale), want + held, burst))
  end
  -- A quarter horizon: the step a rate lease drips in, and the least a retry waits for tokens
  -- that come back only as other nodes report what they spent.
  local step = mfloor(horizon / 4)
  -- A rate lease, if asked for: at most its share (any rate while the bucket sat at its
  -- ceiling: what no leaser holds would only be lost), the rate no other leaser holds, and what
  -- its counted tokens can carry (two steps' worth of them).
  if want_rate and want_rate > 0 and step > 0 then
    local fleet = mmin(mfloor(rate * 1e9 / period), MAX)
    local fits = mfloor(mfloor(r.o / 2) * 1e9 / step)
    local most = share
    if at_ceiling then most = fleet end
    local tau = mmin(want_rate, most, mmax(0, fleet - res), fits)
    if tau > 0 then
      res = res + tau
      r.rt = tau
      held_rate = tau
    end
  end
  -- When the next lease of `need` could succeed (0 if it could now), after this grant too, so
  -- a node paces itself instead of asking in vain: against credit once the bucket holds
  -- `need`; or, if the bucket is already above the reserve (the fleet is not keeping up with
  -- the refill), first come first served once it holds `need` above it. Below the reserve
  -- that second way is a mirage: other nodes drain the bucket long before it gets there.
  -- (The bucket's ceiling, as it stays for the rest of this call: `out` is final here.)
  local top = mmax(0, cap - out * scale)
  local short = need * scale + hold - level
  if short > 0 then
    retry = fill_time(q, short)
    -- Refill stops at capacity − outstanding: past that, tokens come back only as other nodes
    -- report what they spent (at their next lease, about a horizon away) or return it, so
    -- asking sooner would only come back empty.
    if need * scale + hold > top then retry = mmax(retry, step) end
  end
  if free < need then
    local credit_short = (need - free) * scale - r.c
    if credit_short > 0 then
      -- From here its credit accrues at its share less the rate it holds after this call, not
      -- the one it held before (a node that gave its rate up accrues at its whole share).
      local next_rho = mmax(0, whole_share - held_rate * scale / 1e9)
      local wait = horizon
      if next_rho > 0 then
        wait = mceil(credit_short / next_rho)
      elseif held_rate > 0 then
        -- Its rate is all its share: only tokens above the reserve are for it.
        wait = mmax(horizon, fill_time(q, mmax(0, (reserve + need) * scale + hold - level)))
      end
      if wait > retry then retry = mmin(wait, MAX_TIME) end
    end
  end
  local above = (reserve + need) * scale + hold
  if whole >= reserve and above <= top then
    local by_free = 0
    if above > level then by_free = fill_time(q, above - level) end
    if by_free < retry then retry = by_free end
  end
  r.exp = mmin(now + ttl, MAX_TIME)
  expiry = r.exp
  -- A claim: refused, due (its credit covers its whole step) and short only because the level
  -- is, with no other claim pending and a step the bucket can reach. It lasts until the refill
  -- should have served it and a quarter horizon more (never past its lease); collected, or no
  -- longer due, it ends.
  local step_units = need * scale
  if granted == 0 and rho > 0 and hold == 0 and r.c >= step_units and step_units > level
      and step_units <= top then
    claim = { node = node, units = step_units,
      untl = mmin(now + retry + step, r.exp) }
    meta_dirty = true
  elseif mine then
    claim = nil
    meta_dirty = true
  end
  record = encode(r)
  -- The expiry as the score's text with every digit, written out here, in the call a fleet
  -- makes most (`int_str` costs a function call and a '%.0f': 2 600 instructions more): its
  -- hundred-millions, then the rest as eight digits with their zeros, each a C long even on
  -- 32-bit builds (below 2^27 and 10^8). `exp / 1e8` never rounds up to the next integer (the
  -- quotient lies at least 1e-8 below it, and below 2^27 a double rounds by at most 0.75e-8),
  -- so the rest is in 0 ..= 10^8 - 1. A score with leading zeros (an explicit time below 10^8)
  -- reads as the same number.
  local hi = mfloor(r.exp / 1e8)
  added = redis.call('ZADD', KEYS[3], string.format('%d%08d', hi, r.exp - hi * 1e8), node)
  if count then count = count + added end
  if r.exp < earliest then
    earliest = r.exp
    meta_dirty = true
  end
elseif node == '' then
  level = mmin(level + mmin(want, burst) * scale, ceiling(q, out))
else
  local r = parse(own_raw)
  if r and seq > r.rseq then
    local give = mmin(want, r.o)
    r.o = r.o - give
    out = mmax(0, out - give)
    level = mmin(level + mmin(give, burst) * scale, ceiling(q, out))
    r.rseq = seq
    if leaving == 1 then
      forget(node, r)
    else
      record = encode(r)
    end
  end
end

local reset = fill_time(q, mmax(0, cap - out * scale) - level)
-- The latest lease expiry on record (0 if none): read back if a record may have gone.
if latest == nil or forgot then
  latest = 0
  if leasers then
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    if #last > 0 then latest = tonumber(last[2]) end
  end
elseif expiry and expiry > latest then
  latest = expiry
end
if level >= cap and out == 0 and latest == 0 then
  redis.call('DEL', unpack(KEYS, 1, mmin(#KEYS, 3)))
else
  -- Kept until it would be full: every lease expired, then the whole capacity refilled (in
  -- doubles, rounded up: two milliseconds off at worst, within the slack), as text by Lua's own
  -- conversion (see int_str).
  local keep = mceil((cap - level) / (inc * 1000))
  if latest > 0 then keep = keep + mceil(mmax(0, latest - now) / 1000) end
  local keep_ms = keep + SLACK_MS
  local state
  if res == 0 then
    state = struct.pack(STATE, 1, level, scale, ts, out, dsum, rate, period, burst, latest)
  else
    state = struct.pack(STATE2, 2, level, scale, ts, out, dsum, rate, period, burst, latest, res)
  end
  redis.call('SET', KEYS[1], state, 'PX', keep_ms .. '')
  -- The leasers' keys expire with the bucket, never before it: a bucket whose records had
  -- expired away would count their tokens as outstanding for good. Their expiry is set, to
  -- the slack beyond the bucket's, when the call found no bookkeeping of format 2 to 4 (the hash
  -- may be new), at an explicit time (not the server's), and when the expiry set's own expiry
  -- (PTTL: one read, where two PEXPIREs are two writes) is within a second of the bucket's new
  -- one: about once per slack on a busy bucket. The expiry set is the key a call may create
  -- (its first member, by ZADD: no expiry, PTTL -1); both keys' expiries are always set
  -- together. Set after the bucket's, as each expiry counts from the server's clock when its
  -- command runs, which may tick between the two (Redis 7.0).
  if latest > 0 then
    -- A leaser added or dropped: the count changed.
    if forgot or added > 0 then meta_dirty = true end
    local renew = not known or explicit_now
    if not renew then
      -- (An error, such as an ACL without PTTL, reads as "renew".)
      local left = redis.pcall('PTTL', KEYS[3])
      renew = type(left) ~= 'number' or left < keep_ms + 1000
    end
    if renew then
      -- The bookkeeping mended, in case scripts of earlier versions ran (above): the leasers
      -- counted again, and the next call searches for expired leases (every lease on record
      -- expires after `now`: the search has run, or none was due before a later time).
      count, earliest, meta_dirty = nil, now, true
    end
    if meta_dirty then
      count_leasers()
      local units, untl, id = 0, 0, ''
      if claim then units, untl, id = claim.units, claim.untl, claim.node end
      local meta
      if anon_cur > 0 or anon_prev > 0 then
        meta = struct.pack(META4, 4, count or -1, earliest or 0, units, untl, anon_at, anon_cur,
          anon_prev, anon_credit, anon_tc) .. id
      else
        meta = struct.pack(META, 2, count or -1, earliest or 0, units, untl) .. id
      end
      if record then
        redis.call('HSET', KEYS[2], node, record, '', meta)
      else
        redis.call('HSET', KEYS[2], '', meta)
      end
    elseif record then
      redis.call('HSET', KEYS[2], node, record)
    end
    if renew then
      local ms = (keep_ms + SLACK_MS) .. ''
      redis.call('PEXPIRE', KEYS[2], ms)
      redis.call('PEXPIRE', KEYS[3], ms)
    end
  elseif meta_raw then
    -- The last leaser is gone: so is the bookkeeping.
    redis.call('HDEL', KEYS[2], '')
  end
end
local left = floor_div(level, scale)
-- With 3 keys the rate held goes last, and only to a call that asked for one (a client of the
-- 3-key protocol that never does reads five entries).
if #KEYS < 4 then
  if want_rate then return { granted, left, retry, reset, share, held_rate } end
  return { granted, left, retry, reset, share }
end
-- A node's lease also learns how many nodes hold leases on the bucket (its policy sizes a
-- lease by its part of the fleet), after the rate it holds (0 if it asked for none).
-- A packed call hears the same numbers as doubles in one string (see "Packed node calls"),
-- written out here rather than by a shared function: a function is built anew on every call
-- of the script, and this one cost more than the replies' two copies.
if held then
  -- (0 stays "not known": no claimant is added to a count the server refused.)
  local nodes = count_leasers()
  if nodes and anon_asking then nodes = nodes + 1 end
  nodes = nodes or 0
  if packed_call then
    return struct.pack(REPLY11, granted, left, retry, reset, share, rate, period, burst, source,
      held_rate, nodes)
  end
  return { granted, left, retry, reset, share, rate, period, burst, source, held_rate, nodes }
end
if packed_call then
  return struct.pack(REPLY9, granted, left, retry, reset, share, rate, period, burst, source)
end
return { granted, left, retry, reset, share, rate, period, burst, source }
