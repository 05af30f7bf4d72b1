-- ratelease distributed lock, after Redisson's RedissonLock: one script, three operations.
--
-- KEYS[1]  the lock hash     <prefix>{<name>}:lock   field <owner> = re-entry count,
--                                                     field "#fence" = fencing token of this hold
-- KEYS[2]  the fence counter <prefix>{<name>}:fence  (never expires: tokens only increase)
-- ARGV[1]  op: "acquire", "release" or "extend"
-- ARGV[2]  owner id (non-empty, must not start with '#')
-- ARGV[3]  lease time, ms (integer, 1 ..= 2^52)
-- ARGV[4]  release only: the unlock channel <prefix>{<name>}:unlock (a channel, not a key)
-- ARGV[5]  release and extend, optional: the fencing token of the hold the caller has; the
--          owner holds the lock only if this hold's "#fence" is that token ("" or absent: any
--          hold of the owner). A guard of an earlier hold whose lease ran out must not release
--          or renew the owner's later hold (integer, 1 ..= 2^53)
--
-- acquire  {1, fence, count}  acquired (count = re-entry count, 1 on a first acquisition, which
--                             draws a new fencing token); {0, pttl} held by another owner, pttl =
--                             ms until its lease ends (-1: none)
-- release  count left (>= 0), or -1 if `owner` does not hold the lock (expired, or never held,
--          or ARGV[5] names another hold).
--          Only the owner may release; the count goes down by one, the lease is renewed while
--          re-entries remain, and at zero the hash is deleted and "unlocked" is published so
--          waiters retry at once.
-- extend   1 if `owner` holds the lock (the hold ARGV[5] names, if given; its lease now ends in
--          ARGV[3] ms), else 0 (the watchdog)
--
-- Errors: "RATELEASE <why>" for bad arguments; never a Lua runtime error.

if #KEYS ~= 2 then
  return redis.error_reply('RATELEASE lock needs 2 keys')
end
local op = ARGV[1]
if op ~= 'acquire' and op ~= 'release' and op ~= 'extend' then
  return redis.error_reply('RATELEASE bad lock op')
end
local owner = ARGV[2]
if owner == nil or owner == '' or string.sub(owner, 1, 1) == '#' then
  return redis.error_reply('RATELEASE bad lock owner')
end
local lease = tonumber(ARGV[3])
if lease == nil or lease ~= lease or lease < 1 or lease ~= math.floor(lease) or lease > 2^52 then
  return redis.error_reply('RATELEASE bad lease time')
end
lease = string.format('%.0f', lease)

if op == 'acquire' then
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
end

local hold = ARGV[5]
if hold ~= nil and hold ~= '' then
  local n = tonumber(hold)
  if n == nil or n ~= n or n < 1 or n ~= math.floor(n) or n > 2^53 then
    return redis.error_reply('RATELEASE bad fencing token')
  end
  hold = string.format('%.0f', n)
else
  hold = nil
end
if redis.call('HEXISTS', KEYS[1], owner) == 0
    or (hold and redis.call('HGET', KEYS[1], '#fence') ~= hold) then
  if op == 'extend' then return 0 end
  return -1
end
if op == 'extend' then
  redis.call('PEXPIRE', KEYS[1], lease)
  return 1
end
local channel = ARGV[4]
if channel == nil or channel == '' then
  return redis.error_reply('RATELEASE bad unlock channel')
end
local count = redis.call('HINCRBY', KEYS[1], owner, -1)
if count > 0 then
  redis.call('PEXPIRE', KEYS[1], lease)
  return count
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', channel, 'unlocked')
return 0
