-- ratelease helpers: the head of every script but lock.lua.
--
-- token_bucket.lua is sent as this file followed by the script; concurrency.lua as this file,
-- then arguments.lua (readers of text arguments), then the script; fixed_window.lua,
-- sliding_window.lua and leaky_bucket.lua as this file, arguments.lua, then prelude.lua (the
-- arguments they share), then the script. The crate's TOKEN_BUCKET_LUA, CONCURRENCY_LUA,
-- FIXED_WINDOW_LUA, SLIDING_WINDOW_LUA and LEAKY_BUCKET_LUA are those texts put together; a
-- client in another language concatenates the files the same way (nothing in between). Each
-- script documents its own keys, arguments and reply at the top of its file.
--
-- Loading it only defines these (nothing runs, no argument is read, until a script calls them):
--   mfloor, mceil, mmin, mmax   math.floor, math.ceil, math.min and math.max, held in locals:
--               through the global, a `math.min` call also looks up `math` and `min`, which
--               is about a third of what the whole call costs in Redis's Lua
--   MAX         2^52, the largest integer argument (and stored value) the scripts accept
--   MAX_TIME    2^53, the largest time in µs where a script allows one beyond MAX
--   SLACK_MS    how many ms stored state outlives the time it could matter
--   int_val(x, lo, hi)  x as an integer in [lo, hi], or nil
--   int_str(x)          an integer as a string with every digit, for redis.call
--   server_now()        the Redis server clock (TIME) in µs
--   floor_div(a, b), ceil_div(a, b)  exact integer division, rounded down / up
--   fixed_point(r, p, b)  a quota's units (rate r per period p µs, burst b; integers in
--                       1 ..= 2^52): one token is `scale = p / gcd(r, p)` units, one µs adds
--                       `inc = r / gcd` and the capacity is `cap = b × scale`; returns scale,
--                       inc, cap, or nil if cap > 2^52
--   bad(name)           the "RATELEASE invalid argument <name>" error reply
-- Every value stays an exact integer in a Lua double (below 2^53).

local mfloor, mceil, mmin, mmax = math.floor, math.ceil, math.min, math.max
local MAX = 4503599627370496 -- 2^52
local MAX_TIME = 9007199254740992 -- 2^53
local SLACK_MS = 10000

-- The whitespace-separated fields of a text record, or nil unless there are exactly n.
local function text_fields(raw, n)
  local f = {}
  for x in string.gmatch(raw, '%S+') do f[#f + 1] = x end
  if #f ~= n then return nil end
  return f
end

-- An integer in [lo, hi], or nil. `+ 0` turns -0 (which "-0" parses to) into 0, so it is
-- never stored as "-0", which strict integer parsers in other clients reject.
-- (`v % 1` is exact for a finite v, and the range checks have already ruled out ±inf.)
local function int_val(x, lo, hi)
  local v = tonumber(x)
  if v == nil or v ~= v or v < lo or v > hi or v % 1 ~= 0 then
    return nil
  end
  return v + 0
end

-- An integer as a string with every digit. Lua's own conversion (tostring, ..) uses %.14g, which
-- rounds values above 1e14, such as a time in µs. A count of ms stays below 1e14, where %.14g
-- writes every digit: it goes as `ms .. ''`, a string.format less. (Never as a Lua number:
-- Redis 7.2.0-7.2.4 write a number given to redis.call such as 3e8 as "3e+08", which PX and
-- PEXPIRE refuse. '%d' would cost less than half as much as '%.0f', but it formats a C long:
-- 32 bits on 32-bit and Windows builds of Redis-compatible servers.)
local function int_str(x)
  return string.format('%.0f', x + 0)
end

-- The server's clock, µs. Arithmetic reads TIME's two numeric strings with one parse each
-- (tonumber: two).
local function server_now()
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- Exact floor(a / b) and ceil(a / b) for integers 0 <= a, b <= 2^53 whose products stay exact.
local function floor_div(a, b)
  local q = mfloor(a / b)
  if q * b > a then q = q - 1 end
  if (q + 1) * b <= a then q = q + 1 end
  return q
end

-- (Written out, not as floor_div and a step up: a function call costs Redis's Lua more than
-- the arithmetic, and every lease divides this way a few times.)
local function ceil_div(a, b)
  local q = mceil(a / b)
  if q * b < a then q = q + 1 end
  if (q - 1) * b >= a then q = q - 1 end
  return q
end

local function fixed_point(r, p, b)
  local g, x = r, p
  while x ~= 0 do g, x = x, g % x end
  local scale = p / g
  local cap = b * scale
  if cap > MAX then return nil end
  return scale, r / g, cap
end

local function bad(name)
  return redis.error_reply('RATELEASE invalid argument ' .. name)
end

