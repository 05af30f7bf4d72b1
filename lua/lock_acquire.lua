-- ratelease distributed lock: acquire (re-entrant), after Redisson's RedissonLock.
--
-- KEYS[1]  the lock hash   <prefix>{<name>}:lock   field <owner> = re-entry count,
--                                                   field "#fence" = fencing token of this hold
-- KEYS[2]  the fence counter <prefix>{<name>}:fence (never expires: tokens only increase)
-- ARGV[1]  owner id (non-empty, must not start with '#')
-- ARGV[2]  lease time, ms (integer >= 1)
--
-- Reply:  {1, fence, count}   acquired (count = re-entry count, 1 on a first acquisition)
--         {0, pttl}           held by another owner; pttl = ms until its lease ends (-1: none)
-- Errors: "RATELEASE <why>" for bad arguments; never a Lua runtime error.

if #KEYS ~= 2 then
  return redis.error_reply('RATELEASE lock_acquire needs 2 keys')
end
local owner = ARGV[1]
if owner == nil or owner == '' or string.sub(owner, 1, 1) == '#' then
  return redis.error_reply('RATELEASE bad lock owner')
end
local lease = tonumber(ARGV[2])
if lease == nil or lease < 1 or lease ~= math.floor(lease) or lease > 2^52 then
  return redis.error_reply('RATELEASE bad lease time')
end

if redis.call('EXISTS', KEYS[1]) == 0 then
  local fence = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], owner, 1, '#fence', fence)
  redis.call('PEXPIRE', KEYS[1], lease)
  return {1, fence, 1}
end
if redis.call('HEXISTS', KEYS[1], owner) == 1 then
  local count = redis.call('HINCRBY', KEYS[1], owner, 1)
  redis.call('PEXPIRE', KEYS[1], lease)
  local fence = tonumber(redis.call('HGET', KEYS[1], '#fence')) or 0
  return {1, fence, count}
end
return {0, redis.call('PTTL', KEYS[1])}
