-- ratelease fixed window: at most `rate` tokens in each window of `period`.
-- Sent after lua/helpers.lua, lua/arguments.lua and lua/prelude.lua, which reads the
-- arguments and documents the shared protocol.
--
-- A window opens with the first lease after the previous one ended (as the usual INCRBY +
-- EXPIRE counter: the first request starts the count) and lasts period_us on the store's clock. Tokens
-- granted in it are counted until it ends; then the count starts again from zero. So one window
-- never admits more than `rate`, but two adjacent windows may admit 2 × rate within a moment
-- across their common edge: the price of a fixed window (sliding_window.lua does not pay it).
--
-- KEYS[1]  the window hash: s = start of the open window (µs), c = tokens counted in it (≥ 1).
--          Absent, invalid or ended: no window is open and the whole budget is there.
--
-- ARGV     as in prelude.lua (burst = rate); a release's `at` is the start of the window its
--          lease counted in: tokens go back only to that window and only while it is open,
--          so a late release never raises the next window's budget.
--
-- Reply: { granted, remaining, retry_after_us, reset_after_us, at_us }
--   remaining      tokens left in the window's budget
--   retry_after_us the end of the window if its budget is below min, else 0
--   reset_after_us the end of the window (0 if nothing is counted)
--   at_us          the start of the window the grant counts in (now if no window is open)
--
-- State is written only when it changes (a grant, an effective release): denials and peeks are
-- read-only. The hash expires 10 s after its window ends, so idle names cost no memory; expiry
-- never changes an answer, because an ended window reads as absent.

local args, err = read_args(1, true)
if not args then return err end
local rate, period, op, want, min, at, now =
  args.rate, args.period, args.op, args.want, args.min, args.at, args.now

-- The open window, if any. A window that starts after `now` (the clock went back) is still open.
local st = redis.call('HMGET', KEYS[1], 's', 'c')
local s, c = int_val(st[1], 0, MAX), int_val(st[2], 1, MAX)
if not (s and c) or now - s >= period then s, c = nil, 0 end

local granted, retry, changed = 0, 0, false
if op == 'lease' then
  if rate - c >= min then
    granted = mmin(want, rate - c)
    if not s then s = now end
    c = c + granted
    changed = true
  end
elseif op == 'release' and s and at == s and want > 0 then
  c = c - mmin(want, c)
  changed = true
end

local left = mmax(0, rate - c)
-- Below min, some tokens are counted, so a window is open.
if op == 'lease' and left < min then retry = s - now + period end
local reset = 0
if c > 0 then reset = s - now + period end
if changed then
  if c == 0 then
    redis.call('DEL', KEYS[1])
  else
    redis.call('HSET', KEYS[1], 's', int_str(s), 'c', int_str(c))
    redis.call('PEXPIRE', KEYS[1], (ceil_div(reset, 1000) + SLACK_MS) .. '')
  end
end
if c == 0 then s = now end
return { granted, left, retry, reset, s }
