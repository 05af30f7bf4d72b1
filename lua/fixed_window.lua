-- ratelease fixed window: at most `rate` tokens in each window of `period`.
--
-- A window opens with the first lease after the previous one ended (document 001's INCRBY +
-- EXPIRE: the first request starts the count) and lasts period_us on the store's clock. Tokens
-- granted in it are counted until it ends; then the count starts again from zero. So one window
-- never admits more than `rate`, but two adjacent windows may admit 2 × rate within a moment
-- across their common edge: the price of a fixed window (sliding_window.lua does not pay it).
--
-- KEYS[1]  the window hash: s = start of the open window (µs), c = tokens counted in it (≥ 1).
--          Absent, invalid or ended: no window is open and the whole budget is there.
--
-- ARGV[1]  op: "lease", "release" or "peek" (changes nothing, reports the budget)
-- ARGV[2]  rate       tokens per window                   (integer, 1 ..= 2^52)
-- ARGV[3]  period_us  window length in microseconds       (integer, 1 ..= 2^52)
-- ARGV[4]  burst      must equal rate: a window's budget is its rate
-- ARGV[5]  lease: want, the most tokens to grant          (integer, 1 ..= 2^52)
--          release: tokens to give back                   (integer, 0 ..= 2^52)
-- ARGV[6]  lease: min, the fewest acceptable (all-or-nothing below it; 1 ..= min(want, burst))
--          release: `at` from the reply to the lease the tokens came from (the start of its
--          window, integer 0 ..= 2^52; may be "" when giving back 0 tokens). Tokens go back only
--          to that window and only while it is open, so a late release never raises the next
--          window's budget.
-- ARGV[7]  now_us: "" to use the Redis server clock (TIME); an explicit time exists only for
--          deterministic tests and replays                (integer, 0 ..= 2^52)
--
-- Reply: { granted, remaining, retry_after_us, reset_after_us, at_us }
--   granted        tokens taken (0 for release and peek, and for a lease below its min)
--   remaining      tokens left in the window's budget
--   retry_after_us how long until a lease like this one could succeed: the end of the window if
--                  its budget is below min (also sent with a grant; 0 for release and peek)
--   reset_after_us how long until the whole budget is back: the end of the window (0 if
--                  nothing is counted)
--   at_us          the start of the window the grant counts in (now if no window is open)
--
-- State is written only when it changes (a grant, an effective release): denials and peeks are
-- read-only. The hash expires 10 s after its window ends, so idle names cost no memory; expiry
-- never changes an answer, because an ended window reads as absent. Bad arguments get a
-- "RATELEASE …" error reply, never a Lua runtime error, and nothing is written. All values stay
-- exact integers in Lua doubles (below 2^53).

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

-- Exact ceil(a / b) for integers 0 <= a, b <= 2^53.
local function ceil_div(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 end
  if (q + 1) * b <= a then q = q + 1 end
  if q * b < a then q = q + 1 end
  return q
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
if not burst or burst ~= rate then return bad('burst') end

local want, min, at
if op == 'lease' then
  want = int_arg(5, 1, MAX)
  if not want then return bad('want') end
  min = int_arg(6, 1, want)
  if not min or min > burst then return bad('min') end
elseif op == 'release' then
  want = int_arg(5, 0, MAX)
  if not want then return bad('tokens') end
  if (ARGV[6] or '') ~= '' or want > 0 then
    at = int_arg(6, 0, MAX)
    if not at then return bad('at') end
  end
end

local now
if ARGV[7] == nil or ARGV[7] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = int_arg(7, 0, MAX)
  if not now then return bad('now_us') end
end

-- The open window, if any. A window that starts after `now` (the clock went back) is still open.
local st = redis.call('HMGET', KEYS[1], 's', 'c')
local s, c = int_val(st[1], 0, MAX), int_val(st[2], 1, MAX)
if not (s and c) or now - s >= period then s, c = nil, 0 end

local granted, retry, changed = 0, 0, false
if op == 'lease' then
  if rate - c >= min then
    granted = math.min(want, rate - c)
    if not s then s = now end
    c = c + granted
    changed = true
  end
elseif op == 'release' and s and at == s and want > 0 then
  c = c - math.min(want, c)
  changed = true
end

local left = math.max(0, rate - c)
-- Below min, some tokens are counted, so a window is open.
if op == 'lease' and left < min then retry = s - now + period end
local reset = 0
if c > 0 then reset = s - now + period end
if changed then
  if c == 0 then
    redis.call('DEL', KEYS[1])
  else
    redis.call('HSET', KEYS[1], 's', int_str(s), 'c', int_str(c))
    redis.call('PEXPIRE', KEYS[1], int_str(ceil_div(reset, 1000) + SLACK_MS))
  end
end
if c == 0 then s = now end
return { granted, left, retry, reset, s }
