-- SPDX-License-Identifier: BSD-3-Clause
-- Take the read or the write side of a read-write lock.
-- KEYS[1] the base key, KEYS[2] the fence floor, KEYS[3] the fence registry
-- ARGV[1] 'read' or 'write', ARGV[2] token, ARGV[3] owner id ('' for none)
-- ARGV[4] lease ms, ARGV[5] 'wait' or 'try', ARGV[6] a waiting writer's
-- marker expiry in ms (server time), ARGV[7] the waiter's id ('' for a try;
-- see excl_acquire), ARGV[8] the holder record ('' for none), ARGV[9] '1'
-- when the waiter listens for its grant (lib/family.lua: it is registered
-- while busy, and rw_release hands it the lock)
-- Keys: base = the writer's owner value (owner id or token; PX lease),
-- base:holds = token -> "FENCE HOLDER\nwrite" of the writer, base:readers =
-- token -> expiry (server time), base:reader-fences = token -> "FENCE
-- HOLDER\nOWNER" (lib/family.lua, dlock_hold_value),
-- base:writer-wait = the id of a waiting writer (PX marker expiry).
-- Policy, writer preference: while a writer waits, no new reader gets in.
-- Returns {1, fence}, {0, retry ms}, or {-1, why}: 1 the owner holds the
-- write lock already, 2 read while the owner holds the write lock, 3 write
-- while the owner holds a read lock (upgrade).
-- #include fence
-- #include family
local base, kind, token, owner = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local lease, waiting, ttl = tonumber(ARGV[4]), ARGV[5] == 'wait', tonumber(ARGV[6])
local wid, record = ARGV[7], ARGV[8]
local holds, readers, rfences = base .. ':holds', base .. ':readers', base .. ':reader-fences'
local marker, counter = base .. ':writer-wait', base .. ':fence'

local count = redis.call('GET', counter)
local err = dlock_fence_check(counter, count)
if err then
  return err
end
local now = dlock_now_ms()
dlock_prune(readers, now, nil, rfences)

-- Does this owner id hold a read lock here?
local function owner_reads()
  if owner == '' then
    return false
  end
  for _, v in ipairs(redis.call('HVALS', rfences)) do
    if dlock_hold_rest(v) == owner then
      return true
    end
  end
  return false
end

-- A waiter that listens is registered with its grant entry while busy (and
-- comes back before the registration expires); one that stopped listening
-- is dropped. retry: the busy reply's ms.
local function busy(retry, entry_kind, entry_owner)
  if waiting and wid ~= '' then
    if ARGV[9] == '1' then
      dlock_listen_add(base, wid, dlock_grant_entry(entry_kind, token, ARGV[4], record,
                                                    entry_owner), ttl, now)
      if retry < 0 or retry > dlock_refresh_ms(ttl) then
        retry = dlock_refresh_ms(ttl)
      end
    else
      dlock_listen_drop(base, wid)
    end
  end
  return {0, retry}
end
local function taken(fence)
  if wid ~= '' then
    dlock_listen_drop(base, wid)
  end
  return {1, fence}
end

local writer = redis.call('GET', base)
if kind == 'read' then
  local mine = redis.call('HGET', rfences, token)
  if mine then
    -- A retry after a lost reply, or a read lock a release handed us (for
    -- the confirm window): ours for the whole lease from this try.
    dlock_zhold_keep(readers, rfences, token, now, lease)
    return taken(dlock_hold_fence(mine))
  end
  if writer then
    if owner ~= '' and writer == owner then
      return {-1, 2}
    end
    return busy(redis.call('PTTL', base), 'r', owner)
  end
  if redis.call('EXISTS', marker) == 1 and not owner_reads() then
    return busy(redis.call('PTTL', marker), 'r', owner)
  end
  local fence
  fence, err = dlock_fence_next(counter, count, KEYS[2], KEYS[3], lease)
  if not fence then
    return err
  end
  dlock_zhold_set(readers, rfences, token, fence, record, owner, now, lease)
  return taken(fence)
end

local value = owner ~= '' and owner or token
if writer and writer == value then
  local mine = redis.call('HGET', holds, token)
  if mine then -- a retry after a lost reply, or a hand-over (rw_release)
    redis.call('PEXPIRE', base, lease)
    redis.call('PEXPIRE', holds, lease)
    if redis.call('GET', marker) == wid then
      redis.call('DEL', marker)
    end
    return taken(dlock_hold_fence(mine))
  end
  return {-1, 1}
end
if owner_reads() then
  return {-1, 3}
end
local left = nil
if writer then
  left = redis.call('PTTL', base)
else
  local last = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
  if last[2] then
    left = math.max(0, tonumber(last[2]) - now) -- when the last lease ends
  end
end
if left then
  if waiting then
    local w = redis.call('GET', marker)
    if not w or w == wid then
      redis.call('SET', marker, wid, 'PX', ttl)
    end
    if left < 0 or left > dlock_refresh_ms(ttl) then
      left = dlock_refresh_ms(ttl)
    end
  end
  return busy(left, 'w', value)
end
local fence
fence, err = dlock_take(base, holds, value, token, lease, counter, count, KEYS[2], KEYS[3],
                        record, 'write')
if not fence then
  return err
end
if redis.call('GET', marker) == wid then
  redis.call('DEL', marker)
end
return taken(fence)
