-- ratelease token bucket: the one atomic step shared by every process.
--
-- KEYS[1]  the bucket hash (fields: v = level in 1/scale token units, s = scale, t = time in µs)
-- ARGV[1]  op: "lease" or "release"
-- ARGV[2]  rate       tokens added per period            (integer, 1 ..= 2^52)
-- ARGV[3]  period_us  period in microseconds              (integer, 1 ..= 2^52)
-- ARGV[4]  burst      bucket capacity in tokens           (integer, 1 ..= 2^52)
-- ARGV[5]  lease: want, the most tokens to grant          (integer, 1 ..= 2^52)
--          release: tokens to give back                   (integer, 0 ..= burst)
-- ARGV[6]  lease: min, the fewest acceptable (all-or-nothing below it; 1 ..= min(want, burst))
--          release: ignored (pass 0)
-- ARGV[7]  now_us: "" to use the Redis server clock (TIME); an explicit time exists only for
--          deterministic tests and replays                (integer, 0 ..= 2^53)
--
-- Reply: { granted, remaining, retry_after_us, reset_after_us }
--   granted        tokens taken by this call (0 for release, and for a lease that could not reach min)
--   remaining      whole tokens left in the bucket after the call
--   retry_after_us how long until `min` tokens are available (0 if they are now)
--   reset_after_us how long until the bucket is full again
--
-- Arithmetic is exact. One token is `scale = period_us / gcd(rate, period_us)` units and every
-- microsecond adds `inc = rate / gcd` units, so lazy refill keeps sub-token precision with only
-- integers, all below 2^53 where Lua's doubles are exact. A bucket at capacity is deleted:
-- absent means full, so the TTL (time to full + 10 s) never changes an answer.
--
-- Bad arguments get an error reply starting with "RATELEASE", never a Lua runtime error, and
-- nothing is written. Stored state that is not valid (foreign writes, corruption) reads as a
-- full bucket, so the script never stores NaN, negative or over-capacity values.

local MAX = 4503599627370496 -- 2^52
local MAX_TIME = 9007199254740992 -- 2^53
local SLACK_MS = 10000

local function int_arg(i, lo, hi)
  local v = tonumber(ARGV[i])
  if v == nil or v ~= v or v < lo or v > hi or v ~= math.floor(v) then
    return nil
  end
  return v
end

-- redis.call turns Lua numbers into strings with %.14g, which would round values above 1e14.
local function int_str(x)
  return string.format('%.0f', x)
end

-- Exact floor(a / b) and ceil(a / b) for integers 0 <= a, b <= 2^53 whose products stay exact.
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

local op = ARGV[1]
if op ~= 'lease' and op ~= 'release' then
  return redis.error_reply('RATELEASE invalid argument op: ' .. tostring(op))
end
local rate = int_arg(2, 1, MAX)
if not rate then return redis.error_reply('RATELEASE invalid argument rate') end
local period = int_arg(3, 1, MAX)
if not period then return redis.error_reply('RATELEASE invalid argument period_us') end
local burst = int_arg(4, 1, MAX)
if not burst then return redis.error_reply('RATELEASE invalid argument burst') end

local g = gcd(rate, period)
local scale = period / g
local inc = rate / g
local cap = burst * scale
if cap > MAX then return redis.error_reply('RATELEASE invalid argument burst: quota too large') end

local want, min
if op == 'lease' then
  want = int_arg(5, 1, MAX)
  if not want then return redis.error_reply('RATELEASE invalid argument want') end
  min = int_arg(6, 1, want)
  if not min or min > burst then return redis.error_reply('RATELEASE invalid argument min') end
else
  want = int_arg(5, 0, burst)
  if not want then return redis.error_reply('RATELEASE invalid argument tokens') end
end

local now
if ARGV[7] == nil or ARGV[7] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = int_arg(7, 0, MAX_TIME)
  if not now then return redis.error_reply('RATELEASE invalid argument now_us') end
end

-- Load; anything that is not a valid state reads as a full bucket.
local level, ts = cap, now
local st = redis.call('HMGET', KEYS[1], 'v', 's', 't')
local v, s, t = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
if v and s and t and v == v and s == s and t == t and v >= 0 and s >= 1 and t >= 0
    and v == math.floor(v) and s == math.floor(s) and t == math.floor(t)
    and v <= MAX and s <= MAX and t <= MAX_TIME then
  if s == scale then
    level = v
  else
    level = floor_div(v, s) * scale -- whole tokens survive a quota change
  end
  if level > cap then level = cap end
  ts = t
end

-- Lazy refill; a clock that steps back refills nothing and never moves `t` backwards.
if now > ts then
  local need = cap - level
  if need > 0 then
    local dt = now - ts
    if dt >= ceil_div(need, inc) then level = cap else level = level + dt * inc end
  end
  ts = now
end

local granted = 0
local retry = 0
if op == 'lease' then
  local whole = floor_div(level, scale)
  if whole >= min then
    granted = whole
    if granted > want then granted = want end
    level = level - granted * scale
  end
  local need = min * scale - level
  if need > 0 then retry = ceil_div(need, inc) end
else
  level = level + want * scale
  if level > cap then level = cap end
end

local reset = ceil_div(cap - level, inc)
if level >= cap then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 'v', int_str(level), 's', int_str(scale), 't', int_str(ts))
  redis.call('PEXPIRE', KEYS[1], int_str(ceil_div(reset, 1000) + SLACK_MS))
end
return { granted, floor_div(level, scale), retry, reset }
