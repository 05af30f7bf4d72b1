-- ratelease sliding window: at most `rate` tokens in any window of `period` (Redisson's log).
-- Sent after lua/helpers.lua, lua/arguments.lua and lua/prelude.lua, which reads the
-- arguments and documents the shared protocol.
--
-- Every grant is logged with the time it was made; a grant counts until `period` after it, so
-- at any moment the tokens counted are those granted in the last `period`, and a lease is
-- served only if they stay within `rate`. So no window of length `period`, wherever it starts,
-- ever holds more than `rate` grants — the fixed window's 2 × rate at a window edge cannot
-- happen. When short, the reply says how long until enough logged tokens leave the window.
--
-- KEYS[1]  the log, a sorted set: one entry per grant time, member "<t>:<n>" (n ≥ 1 tokens
--          granted at t µs), score t. Grants made at the same microsecond share one entry, and
--          the log never goes back in time (a grant is logged at max(now, newest entry)), so
--          members are unique and the log holds at most min(rate, period_us) entries.
-- KEYS[2]  the log's total, a hash: n = the sum of the entries' tokens (so a call costs
--          O(log N) plus the entries it drops, not O(N)).
-- Both keys must share one {hash tag}.
--
-- ARGV     as in prelude.lua (burst = rate); a peek also drops entries that left the window.
--          A release's `at` is the time its lease was logged: tokens go back only to that
--          entry, and only while it is in the window.
--
-- Reply: { granted, remaining, retry_after_us, reset_after_us, at_us }
--   retry_after_us until enough of the oldest entries have left the window for a lease like
--                  this one. Looked up among the 128 oldest entries; with a longer log it may
--                  be too short (never too long), and the retry gets a new estimate.
--   reset_after_us how long until the log is empty (the newest entry leaves)
--   at_us          the time the grant is logged at: max(now, newest entry)
--
-- Memory: one entry per distinct grant time in the last period, so at most min(rate,
-- period_us) entries (about 60 bytes each); both keys expire 10 s after the newest entry
-- leaves the window. Entries that left are dropped by the next call (its cost is proportional
-- to how many; a call that finds the whole log gone deletes it at once). An invalid total is
-- recounted from the log; an entry that does not parse counts as 0 tokens.

local WALK = 128

local args, err = read_args(2, true)
if not args then return err end
local rate, period, op, want, min, at, now =
  args.rate, args.period, args.op, args.want, args.min, args.at, args.now

-- Tokens of an entry (0 if its member does not parse).
local function count(member)
  return int_val(string.match(member, '^%d+:(%d+)$'), 1, MAX) or 0
end

local function entry(t, n)
  return int_str(t) .. ':' .. int_str(n)
end

-- The newest entry: its member and time, or nil.
local function newest()
  local e = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #e == 0 then return nil, nil end
  return e[1], tonumber(e[2])
end

-- Drop what left the window: entries at or before `cut`.
local cut = now - period
local last, last_t = newest()
local sum, changed = 0, false
if last and last_t <= cut then
  redis.call('DEL', KEYS[1])
  last, last_t, changed = nil, nil, true
elseif last then
  sum = int_val(redis.call('HGET', KEYS[2], 'n'), 0, MAX)
  if not sum then
    sum = 0
    local all = redis.call('ZRANGE', KEYS[1], 0, -1)
    for i = 1, #all do sum = mmin(sum + count(all[i]), MAX) end
    changed = true
  end
  local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int_str(cut))
  if #old > 0 then
    for i = 1, #old do sum = sum - count(old[i]) end
    sum = mmax(0, sum)
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int_str(cut))
    changed = true
  end
end

local t = now
if last and last_t > now then t = last_t end
local granted, retry = 0, 0
if op == 'lease' and rate - sum >= min then
  granted = mmin(want, rate - sum)
  local n = granted
  if last and last_t == t then
    n = n + count(last)
    redis.call('ZREM', KEYS[1], last)
  end
  redis.call('ZADD', KEYS[1], int_str(t), entry(t, n))
  sum = sum + granted
  changed = true
elseif op == 'release' and want > 0 then
  local e = redis.call('ZRANGEBYSCORE', KEYS[1], int_str(at), int_str(at))
  if #e > 0 then
    local n = count(e[1])
    local give = mmin(want, n)
    redis.call('ZREM', KEYS[1], e[1])
    if n > give then redis.call('ZADD', KEYS[1], int_str(at), entry(at, n - give)) end
    sum = mmax(0, sum - give)
    changed = true
  end
end
if changed then last, last_t = newest() end
if not last then sum = 0 end

local left = mmax(0, rate - sum)
if op == 'lease' and left < min then
  -- Until the oldest entries holding `excess` tokens have left.
  local excess = sum + min - rate
  local first = redis.call('ZRANGE', KEYS[1], 0, WALK - 1, 'WITHSCORES')
  local acc, when = 0, now - period
  for i = 1, #first, 2 do
    acc = acc + count(first[i])
    when = tonumber(first[i + 1])
    if acc >= excess then break end
  end
  retry = mmax(0, when - now + period)
end
local reset = 0
if last then reset = last_t - now + period end
if changed then
  if not last then
    redis.call('DEL', KEYS[1], KEYS[2])
  else
    local ms = (ceil_div(reset, 1000) + SLACK_MS) .. ''
    redis.call('HSET', KEYS[2], 'n', int_str(sum))
    redis.call('PEXPIRE', KEYS[1], ms)
    redis.call('PEXPIRE', KEYS[2], ms)
  end
end
return { granted, left, retry, reset, t }
