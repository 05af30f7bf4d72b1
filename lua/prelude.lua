-- ratelease: the head of fixed_window.lua, sliding_window.lua and leaky_bucket.lua.
--
-- Each of those scripts is sent as lua/helpers.lua, lua/arguments.lua, then this file, then its
-- own (the crate's FIXED_WINDOW_LUA, SLIDING_WINDOW_LUA and LEAKY_BUCKET_LUA are the four put
-- together; a client in another language concatenates them the same way). This file reads the
-- arguments the three share, with the helpers of helpers.lua and the readers of arguments.lua:
--
-- ARGV[1]  op: "lease", "release" or "peek" (changes nothing, reports the budget)
-- ARGV[2]  rate       tokens per period                   (integer, 1 ..= 2^52)
-- ARGV[3]  period_us  period in microseconds              (integer, 1 ..= 2^52)
-- ARGV[4]  burst      tokens at once                      (integer, 1 ..= 2^52, and
--                     burst × period_us / gcd(rate, period_us) ≤ 2^52, as a Quota keeps it);
--                     the windows require burst = rate: a window's budget is its rate
-- ARGV[5]  lease: want, the most tokens to grant          (integer, 1 ..= 2^52)
--          release: tokens to give back                   (integer, 0 ..= 2^52)
-- ARGV[6]  lease: min, the fewest acceptable (all-or-nothing below it; 1 ..= min(want, burst))
--          release, windows: `at` from the reply to the lease the tokens came from (integer,
--          0 ..= 2^52; may be "" when giving back 0 tokens); the leaky bucket ignores it
-- ARGV[7]  now_us: "" to use the Redis server clock (TIME); an explicit time exists only for
--          deterministic tests and replays                (integer, 0 ..= 2^52, so that a
--          time plus a period stays an exact integer in a Lua double)
--
-- Reply: { granted, remaining, retry_after_us, reset_after_us, at_us }, redis-cell's fields
-- and `at`, where the grant was counted (each script says what that is):
--   granted        tokens taken (0 for release and peek, and for a lease below its min)
--   remaining      tokens that could be taken now
--   retry_after_us how long until a lease like this one could succeed (also sent with a
--                  grant; 0 for release and peek)
--   reset_after_us how long until the whole budget is back
--
-- Bad arguments get a "RATELEASE …" error reply, never a Lua runtime error, and nothing is
-- written. Every value stays an exact integer in a Lua double (below 2^53).

-- The shared arguments of a script with `nkeys` keys (`windowed`: burst must equal rate and a
-- release names its window), with the quota's fixed point (one token is `scale` units, one µs
-- `inc` units, the capacity `cap` units). Returns them, or nil and the error reply.
local function read_args(nkeys, windowed)
  if #KEYS ~= nkeys then return nil, bad('keys: expected ' .. nkeys) end
  local a = { op = ARGV[1] }
  if a.op ~= 'lease' and a.op ~= 'release' and a.op ~= 'peek' then return nil, bad('op') end
  a.rate = int_arg(2, 1, MAX)
  if not a.rate then return nil, bad('rate') end
  a.period = int_arg(3, 1, MAX)
  if not a.period then return nil, bad('period_us') end
  a.burst = int_arg(4, 1, MAX)
  if not a.burst or (windowed and a.burst ~= a.rate) then return nil, bad('burst') end
  a.scale, a.inc, a.cap = fixed_point(a.rate, a.period, a.burst)
  if not a.scale then return nil, bad('burst') end
  if a.op == 'lease' then
    a.want = int_arg(5, 1, MAX)
    if not a.want then return nil, bad('want') end
    a.min = int_arg(6, 1, a.want)
    if not a.min or a.min > a.burst then return nil, bad('min') end
  elseif a.op == 'release' then
    a.want = int_arg(5, 0, MAX)
    if not a.want then return nil, bad('tokens') end
    if windowed and ((ARGV[6] or '') ~= '' or a.want > 0) then
      a.at = int_arg(6, 0, MAX)
      if not a.at then return nil, bad('at') end
    end
  end
  a.now = now_arg(7, MAX)
  if not a.now then return nil, bad('now_us') end
  return a
end

