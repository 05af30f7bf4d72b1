-- ratelease concurrency limit: at most `limit` permits held across a fleet at once.
-- Sent after lua/helpers.lua (MAX, int_str, bad, …) and lua/arguments.lua (int_arg, now_arg):
-- the crate's CONCURRENCY_LUA is the three put together.
--
-- KEYS[1]  the holders hash  <prefix>{<name>}:conc         field <holder> = "count aseq rseq",
--                                                           field "#total" = sum of the counts
-- KEYS[2]  the expiry zset   <prefix>{<name>}:conc:expiry  member <holder>, score = expiry, µs
-- Both keys must share one {hash tag}. The ":conc" suffix keeps them apart from the token
-- bucket of the same name.
--
-- A holder is one process (one limiter instance), not one permit: its record counts the slots
-- it holds, and it keeps the record alive by calling at least once per ttl (a `sync`). A holder
-- that stops calling (a crash) is reclaimed lazily by the first call after its expiry: its
-- slots come back. A record whose count drops to 0 is deleted; so are the keys with the last
-- record.
--
-- ARGV[1]  op: "acquire", "release", "sync" or "peek"
-- ARGV[2]  now_us: "" to use the Redis server clock (TIME); an explicit time exists only for
--          deterministic tests and replays                      (integer, 0 ..= 2^53)
-- ARGV[3]  holder id (1 ..= 128 bytes, not starting with '#'); peek: may be ""
-- ARGV[4]  acquire: want, the most slots to take               (integer, 1 ..= 2^52)
--          release: slots to give back                         (integer, 0 ..= 2^52)
--          sync:    the count the holder really holds          (integer, 0 ..= 2^52)
-- ARGV[5]  acquire: min, the fewest acceptable (all or nothing below it; 1 ..= want)
-- ARGV[6]  acquire: limit, the caller's concurrency limit      (integer, min ..= 2^52)
-- ARGV[7]  acquire, sync: ttl_us, how long the record lives without another call
--                                                              (integer, 1 ..= 2^52)
-- ARGV[8]  acquire, sync: aseq, the holder's acquire sequence number (integer, 0 ..= 2^52)
-- ARGV[9]  acquire, release, sync: rseq, a release sequence number (integer, 0 ..= 2^52)
-- Arguments an op does not use are ignored.
--
-- acquire  takes min(want, limit − in_use) slots if that is at least `min`, else none; renews
--          the holder's record (if it has one, or gets one). aseq is remembered (the largest
--          of a granting acquire); a new record starts with rseq = ARGV[9], so releases the
--          holder sent before it (for slots of a record that is gone) are ignored.
-- release  gives back min(n, count) slots of this holder, never another's; applied only if
--          rseq is above the record's (a retried or late release is ignored). Expiry unchanged.
-- sync     the holder's renewal and repair: sets its count to ARGV[4] (0 deletes the record)
--          and renews it, unless an acquire with a larger aseq was already applied (then it
--          only renews: that acquire's slots are not in the count). This heals slots leaked by
--          calls whose replies were lost, and re-registers a holder whose record was lost.
--          rseq and aseq become the larger of the record's and the call's.
-- peek     nothing but the lazy reclaim.
--
-- Reply: { granted, in_use, held, existed }
--   granted  acquire: slots taken; release: slots given back; sync: 1 if the count was set,
--            0 if only renewed; peek: 0
--   in_use   slots held across the fleet after the call (may exceed a caller's limit if
--            holders disagree on it, or after a sync re-registered a lost record)
--   held     the holder's count after the call (0 without a record)
--   existed  1 if the holder had a live record before the call
--
-- Bad arguments get a "RATELEASE invalid argument …" error reply and nothing is written; a
-- sync that would take in_use above 2^52 is refused the same way. Invalid values stored in
-- the keys never raise a Lua error: an unparsable record reads as absent, an invalid total is
-- recounted from the indexed records. A key of another type (a string where the hash should
-- be) raises Redis's WRONGTYPE error at the first read, before anything is written.

local TOTAL = '#total'

if #KEYS ~= 2 then return bad('keys') end
local op = ARGV[1]
if op ~= 'acquire' and op ~= 'release' and op ~= 'sync' and op ~= 'peek' then
  return bad('op')
end

local now = now_arg(2, MAX_TIME)
if not now then return bad('now_us') end

local holder = ARGV[3] or ''
if #holder > 128 or string.sub(holder, 1, 1) == '#' or (holder == '' and op ~= 'peek') then
  return bad('holder')
end

local n, min, limit, ttl, aseq, rseq
if op == 'acquire' then
  n = int_arg(4, 1, MAX)
  if not n then return bad('want') end
  min = int_arg(5, 1, n)
  if not min then return bad('min') end
  limit = int_arg(6, 1, MAX)
  if not limit then return bad('limit') end
  if min > limit then return bad('min') end
elseif op == 'release' then
  n = int_arg(4, 0, MAX)
  if not n then return bad('n') end
elseif op == 'sync' then
  n = int_arg(4, 0, MAX)
  if not n then return bad('count') end
end
if op == 'acquire' or op == 'sync' then
  ttl = int_arg(7, 1, MAX)
  if not ttl then return bad('ttl_us') end
  aseq = int_arg(8, 0, MAX)
  if not aseq then return bad('aseq') end
end
if op ~= 'peek' then
  rseq = int_arg(9, 0, MAX)
  if not rseq then return bad('rseq') end
end

-- A record: count (≥ 1), largest granting aseq, last applied rseq; nil if not valid.
local function parse(raw)
  if not raw then return nil end
  local f = text_fields(raw, 3)
  if not f then return nil end
  local r = { c = int_val(f[1], 1, MAX), a = int_val(f[2], 0, MAX), s = int_val(f[3], 0, MAX) }
  if not (r.c and r.a and r.s) then return nil end
  return r
end

-- Read: the total (recounted if invalid), the expired holders, the caller's record.
local total = int_val(redis.call('HGET', KEYS[1], TOTAL), 0, MAX)
if not total then
  -- Absent (no holders) or invalid: recount the indexed records (the commands of the
  -- least-privilege ACL suffice: no HGETALL).
  total = 0
  local all = redis.call('ZRANGE', KEYS[2], 0, -1)
  for i = 1, #all do
    local r = parse(redis.call('HGET', KEYS[1], all[i]))
    if r then total = mmin(total + r.c, MAX) end
  end
end
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', int_str(now))
local expired = false
for i = 1, #due do
  local r = parse(redis.call('HGET', KEYS[1], due[i]))
  if r then total = mmax(0, total - r.c) end
  if due[i] == holder then expired = true end
end
local rec = nil
if holder ~= '' and not expired then rec = parse(redis.call('HGET', KEYS[1], holder)) end
local existed = 0
if rec then existed = 1 end
local stale = op == 'sync' and rec ~= nil and rec.a > aseq
if op == 'sync' and not stale then
  local old = 0
  if rec then old = rec.c end
  if mmax(0, total - old) + n > MAX then return bad('count') end
end

-- Write: reclaim the expired holders, then the op.
for i = 1, #due do
  redis.call('HDEL', KEYS[1], due[i])
  redis.call('ZREM', KEYS[2], due[i])
end

local function put(r, renew)
  redis.call('HSET', KEYS[1], holder, int_str(r.c) .. ' ' .. int_str(r.a) .. ' ' .. int_str(r.s))
  if renew then redis.call('ZADD', KEYS[2], int_str(mmin(now + ttl, MAX_TIME)), holder) end
end

local function drop()
  redis.call('HDEL', KEYS[1], holder)
  redis.call('ZREM', KEYS[2], holder)
  rec = nil
end

local granted = 0
if op == 'acquire' then
  local avail = mmax(0, limit - total)
  if avail >= min then granted = mmin(n, avail) end
  if granted > 0 then
    if not rec then rec = { c = 0, a = 0, s = rseq } end
    rec.c = rec.c + granted
    rec.a = mmax(rec.a, aseq)
    total = total + granted
  end
  if rec then put(rec, true) end
elseif op == 'release' then
  if rec and rseq > rec.s then
    granted = mmin(n, rec.c)
    rec.c = rec.c - granted
    rec.s = rseq
    total = mmax(0, total - granted)
    if rec.c == 0 then drop() else put(rec, false) end
  end
elseif op == 'sync' then
  if stale then
    put(rec, true)
  else
    granted = 1
    local old, a, s = 0, aseq, rseq
    if rec then old, a, s = rec.c, mmax(rec.a, aseq), mmax(rec.s, rseq) end
    total = mmax(0, total - old) + n
    if n == 0 then
      drop()
    else
      rec = { c = n, a = a, s = s }
      put(rec, true)
    end
  end
end

local held = 0
if rec then held = rec.c end
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if #last == 0 then
  redis.call('DEL', KEYS[1], KEYS[2])
  total = 0
else
  redis.call('HSET', KEYS[1], TOTAL, int_str(total))
  -- Kept until the last holder would expire, plus slack.
  local ms = (mfloor((tonumber(last[2]) - now + 999) / 1000) + SLACK_MS) .. ''
  redis.call('PEXPIRE', KEYS[1], ms)
  redis.call('PEXPIRE', KEYS[2], ms)
end
return { granted, total, held, existed }
