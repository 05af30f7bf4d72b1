-- ratelease argument readers: after lua/helpers.lua, the head of concurrency.lua and of
-- prelude.lua (the window and leaky-bucket scripts).
--
-- Those scripts read their arguments one by one from text; the token bucket reads its own (a
-- node's call comes packed) and is sent without this file, which would only cost it two
-- closures built on every call. Loading it only defines these:
--   int_arg(i, lo, hi)  int_val(ARGV[i], lo, hi)
--   now_arg(i, hi)      the time in µs: the Redis server clock (TIME) if ARGV[i] is absent or
--                       "", else int_arg(i, 0, hi) (nil if that is not valid)

-- int_val(ARGV[i], lo, hi), written out: it runs a dozen times a call.
local function int_arg(i, lo, hi)
  local v = tonumber(ARGV[i])
  if v == nil or v ~= v or v < lo or v > hi or v % 1 ~= 0 then
    return nil
  end
  return v + 0
end

-- The time of the call: the server's clock, or the explicit time of a test or replay.
local function now_arg(i, hi)
  if ARGV[i] == nil or ARGV[i] == '' then return server_now() end
  return int_arg(i, 0, hi)
end
