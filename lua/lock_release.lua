-- ratelease distributed lock: release one hold.
--
-- KEYS[1]  the lock hash <prefix>{<name>}:lock
-- ARGV[1]  owner id
-- ARGV[2]  lease time, ms (integer >= 1): the lease is renewed while re-entries remain
-- ARGV[3]  the unlock channel <prefix>{<name>}:unlock (a channel, not a key)
--
-- Only the owner may release. The re-entry count goes down by one; at zero the hash is deleted
-- and "unlocked" is published on the channel, so waiters retry at once.
--
-- Reply:  count left (>= 0), or -1 if `owner` does not hold the lock (expired, or never held).
-- Errors: "RATELEASE <why>" for bad arguments; never a Lua runtime error.

if #KEYS ~= 1 then
  return redis.error_reply('RATELEASE lock_release needs 1 key')
end
local owner = ARGV[1]
if owner == nil or owner == '' or string.sub(owner, 1, 1) == '#' then
  return redis.error_reply('RATELEASE bad lock owner')
end
local lease = tonumber(ARGV[2])
if lease == nil or lease < 1 or lease ~= math.floor(lease) or lease > 2^52 then
  return redis.error_reply('RATELEASE bad lease time')
end
local channel = ARGV[3]
if channel == nil or channel == '' then
  return redis.error_reply('RATELEASE bad unlock channel')
end

if redis.call('HEXISTS', KEYS[1], owner) == 0 then
  return -1
end
local count = redis.call('HINCRBY', KEYS[1], owner, -1)
if count > 0 then
  redis.call('PEXPIRE', KEYS[1], lease)
  return count
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', channel, 'unlocked')
return 0
