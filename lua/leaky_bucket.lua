-- ratelease leaky bucket (document 004's funnel) as GCRA: one theoretical arrival time per key.
--
-- The funnel holds `burst` tokens and leaks `rate` tokens per `period`. A lease of n pours n
-- tokens in if they fit, else nothing. The funnel's whole state is its theoretical arrival time
-- (TAT): when it will be empty. Its content at `now` is `TAT − now` in time, `(TAT − now) /
-- emission interval` in tokens, where the emission interval is period / rate. So after a burst
-- of `burst` tokens, leases are served spaced one emission interval apart.
--
-- Arithmetic. As in token_bucket.lua, one token is `scale = period_us / gcd(rate, period_us)`
-- units and one microsecond is `inc = rate / gcd` units, so the emission interval is exactly
-- `scale` units and the capacity `cap = burst × scale` units (≤ 2^52). The TAT is stored as
-- whole microseconds plus a fraction in units (0 ≤ f < inc): exact, with no drift.
--
-- KEYS[1]  the funnel hash: t = TAT in whole µs (0 ..= 2^53), f = its fraction (units,
--          0 ..= inc - 1).
--          Absent (or invalid): the funnel is empty.
--
-- ARGV[1]  op: "lease", "release" or "peek" (changes nothing, reports the funnel)
-- ARGV[2]  rate       tokens leaked per period            (integer, 1 ..= 2^52)
-- ARGV[3]  period_us  period in microseconds              (integer, 1 ..= 2^52)
-- ARGV[4]  burst      funnel capacity in tokens           (integer, 1 ..= 2^52, and
--                     burst × scale ≤ 2^52)
-- ARGV[5]  lease: want, the most tokens to grant          (integer, 1 ..= 2^52)
--          release: tokens to take back out of the funnel (integer, 0 ..= 2^52; it never
--          goes below empty)
-- ARGV[6]  lease: min, the fewest acceptable (all-or-nothing below it; 1 ..= min(want, burst))
--          release: ignored
-- ARGV[7]  now_us: "" to use the Redis server clock (TIME); an explicit time exists only for
--          deterministic tests and replays                (integer, 0 ..= 2^52)
--
-- Reply: { granted, remaining, retry_after_us, reset_after_us, at_us }
--   granted        tokens taken (0 for release and peek, and for a lease below its min)
--   remaining      whole tokens of room left in the funnel
--   retry_after_us how long until a lease like this one could succeed (also sent with a
--                  grant; 0 for release and peek)
--   reset_after_us how long until the funnel is empty (the TAT)
--   at_us          now
--
-- State is written only when it changes: denials and peeks are read-only. The hash expires 10 s
-- after the funnel would be empty (document 004: leaking duration + 10 s), so idle funnels
-- vanish. A TAT further ahead than a full funnel (the clock went back) reads as full. Bad
-- arguments get a "RATELEASE …" error reply, never a Lua runtime error, and nothing is written.

local MAX = 4503599627370496 -- 2^52
local SLACK_MS = 10000

-- An integer in [lo, hi], or nil (`+ 0` turns -0 into 0).
local function int_val(x, lo, hi)
  local v = tonumber(x)
  if v == nil or v ~= v or v < lo or v > hi or v ~= math.floor(v) then
    return nil
  end
  return v + 0
end

local function int_arg(i, lo, hi)
  return int_val(ARGV[i], lo, hi)
end

-- redis.call turns Lua numbers into strings with %.14g, which would round values above 1e14.
local function int_str(x)
  return string.format('%.0f', x + 0)
end

-- Exact floor(a / b) and ceil(a / b) for integers 0 <= a, b <= 2^53.
local function floor_div(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 end
  if (q + 1) * b <= a then q = q + 1 end
  return q
end

local function ceil_div(a, b)
  local q = floor_div(a, b)
  if q * b < a then q = q + 1 end
  return q
end

local function gcd(a, b)
  while b ~= 0 do a, b = b, a % b end
  return a
end

local function bad(name)
  return redis.error_reply('RATELEASE invalid argument ' .. name)
end

if #KEYS ~= 1 then return bad('keys: expected 1') end
local op = ARGV[1]
if op ~= 'lease' and op ~= 'release' and op ~= 'peek' then return bad('op') end
local rate = int_arg(2, 1, MAX)
if not rate then return bad('rate') end
local period = int_arg(3, 1, MAX)
if not period then return bad('period_us') end
local burst = int_arg(4, 1, MAX)
if not burst then return bad('burst') end
local g = gcd(rate, period)
local scale, inc = period / g, rate / g
local cap = burst * scale
if cap > MAX then return bad('burst') end

local want, min
if op == 'lease' then
  want = int_arg(5, 1, MAX)
  if not want then return bad('want') end
  min = int_arg(6, 1, want)
  if not min or min > burst then return bad('min') end
elseif op == 'release' then
  want = int_arg(5, 0, MAX)
  if not want then return bad('tokens') end
end

local now
if ARGV[7] == nil or ARGV[7] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = int_arg(7, 0, MAX)
  if not now then return bad('now_us') end
end

-- The funnel's content in units: how far the TAT is ahead of now, at most `cap`.
local st = redis.call('HMGET', KEYS[1], 't', 'f')
local t, f = int_val(st[1], 0, 2 * MAX), int_val(st[2], 0, MAX)
local b = 0
if t and f and t >= now then
  -- A fraction written under another quota counts as less than one microsecond.
  f = math.min(f, inc - 1)
  if t - now > ceil_div(cap, inc) then
    b = cap
  else
    b = math.min(cap, (t - now) * inc + f)
  end
end

local granted, retry, changed = 0, 0, false
if op == 'lease' then
  local room = floor_div(cap - b, scale)
  if room >= min then
    granted = math.min(want, room)
    b = b + granted * scale
    changed = true
  end
  local need = min * scale - (cap - b)
  if need > 0 then retry = ceil_div(need, inc) end
elseif op == 'release' and want > 0 and b > 0 then
  b = math.max(0, b - math.min(want, burst) * scale)
  changed = true
end

local reset = ceil_div(b, inc)
if changed then
  if b == 0 then
    redis.call('DEL', KEYS[1])
  else
    local whole = floor_div(b, inc)
    redis.call('HSET', KEYS[1], 't', int_str(now + whole), 'f', int_str(b - whole * inc))
    redis.call('PEXPIRE', KEYS[1], int_str(ceil_div(reset, 1000) + SLACK_MS))
  end
end
return { granted, floor_div(cap - b, scale), retry, reset, now }
