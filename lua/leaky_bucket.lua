-- ratelease leaky bucket (a funnel) as GCRA: one theoretical arrival time per key.
-- Sent after lua/helpers.lua, lua/arguments.lua and lua/prelude.lua, which reads the
-- arguments and documents the shared protocol.
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
-- ARGV     as in prelude.lua: a funnel of `burst` tokens leaking `rate` per `period`. A
--          release takes tokens back out (never below empty), wherever they came from.
--
-- Reply: { granted, remaining, retry_after_us, reset_after_us, at_us }
--   remaining      whole tokens of room left in the funnel
--   reset_after_us how long until the funnel is empty (the TAT)
--   at_us          now
--
-- State is written only when it changes: denials and peeks are read-only. The hash expires 10 s
-- after the funnel would be empty (leaking duration + 10 s), so idle funnels
-- vanish. A TAT further ahead than a full funnel (the clock went back) reads as full.

local args, err = read_args(1, false)
if not args then return err end
local burst, scale, inc, cap, op, want, min, now =
  args.burst, args.scale, args.inc, args.cap, args.op, args.want, args.min, args.now

-- The funnel's content in units: how far the TAT is ahead of now, at most `cap`.
local st = redis.call('HMGET', KEYS[1], 't', 'f')
local t, f = int_val(st[1], 0, 2 * MAX), int_val(st[2], 0, MAX)
local b = 0
if t and f and t >= now then
  -- A fraction written under another quota counts as less than one microsecond.
  f = mmin(f, inc - 1)
  if t - now > ceil_div(cap, inc) then
    b = cap
  else
    b = mmin(cap, (t - now) * inc + f)
  end
end

local granted, retry, changed = 0, 0, false
if op == 'lease' then
  local room = floor_div(cap - b, scale)
  if room >= min then
    granted = mmin(want, room)
    b = b + granted * scale
    changed = true
  end
  local need = min * scale - (cap - b)
  if need > 0 then retry = ceil_div(need, inc) end
elseif op == 'release' and want > 0 and b > 0 then
  b = mmax(0, b - mmin(want, burst) * scale)
  changed = true
end

local reset = ceil_div(b, inc)
if changed then
  if b == 0 then
    redis.call('DEL', KEYS[1])
  else
    local whole = floor_div(b, inc)
    redis.call('HSET', KEYS[1], 't', int_str(now + whole), 'f', int_str(b - whole * inc))
    redis.call('PEXPIRE', KEYS[1], (ceil_div(reset, 1000) + SLACK_MS) .. '')
  end
end
return { granted, floor_div(cap - b, scale), retry, reset, now }
