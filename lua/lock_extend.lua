-- ratelease distributed lock: extend the lease of a held lock (the watchdog's call).
--
-- KEYS[1]  the lock hash <prefix>{<name>}:lock
-- ARGV[1]  owner id
-- ARGV[2]  lease time, ms (integer >= 1)
--
-- Reply:  1 if `owner` holds the lock (its lease now ends in ARGV[2] ms), 0 if it does not.
-- Errors: "RATELEASE <why>" for bad arguments; never a Lua runtime error.

if #KEYS ~= 1 then
  return redis.error_reply('RATELEASE lock_extend needs 1 key')
end
local owner = ARGV[1]
if owner == nil or owner == '' or string.sub(owner, 1, 1) == '#' then
  return redis.error_reply('RATELEASE bad lock owner')
end
local lease = tonumber(ARGV[2])
if lease == nil or lease < 1 or lease ~= math.floor(lease) or lease > 2^52 then
  return redis.error_reply('RATELEASE bad lease time')
end

if redis.call('HEXISTS', KEYS[1], owner) == 0 then
  return 0
end
redis.call('PEXPIRE', KEYS[1], lease)
return 1
