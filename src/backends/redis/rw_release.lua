-- SPDX-License-Identifier: BSD-3-Clause
-- Release a read or write lock, or downgrade a write lock to a read lock.
-- KEYS[1] the base key (see rw_acquire), KEYS[2] the fence floor, KEYS[3]
-- the fence registry
-- ARGV[1] 'read', 'write' or 'downgrade', ARGV[2] token, ARGV[3] the
-- writer's owner value, ARGV[4] release channel, ARGV[5] lease ms (for
-- downgrade), ARGV[6] owner id ('' for none), ARGV[7] the confirm window (ms)
-- Returns 1 done, 0 the lock was not ours (nothing changed).
-- When the lock may admit waiters, it is handed to those that listen for
-- their grant (lib/family.lua), as release.lua hands the plain mutex over:
-- the write lock to the waiting writer (the marker's) when it listens, or
-- else, with no writer waiting, a read lock to each reader that listens;
-- each with the next fence, for the confirm window (or its lease when
-- shorter), its fence pushed to its list. The other waiters are woken all
-- at once ('all'): readers can share. A write lock handed over wakes
-- nobody.
-- #include fence
-- #include family
local base, op, token = KEYS[1], ARGV[1], ARGV[2]
local holds, readers, rfences = base .. ':holds', base .. ':readers', base .. ':reader-fences'
local marker = base .. ':writer-wait'
local window = tonumber(ARGV[7])
local now = dlock_now_ms()

-- The write lock to the marker's writer, if it listens: true when handed.
local function hand_to_writer()
  local wid = redis.call('GET', marker)
  local entry = wid and redis.call('HGET', base .. ':listen-grant', wid)
  if not entry then
    return false
  end
  local fence, px = dlock_grant_hold(base, entry, 'w', 'write', KEYS[2], KEYS[3], window)
  if not fence then
    return false
  end
  redis.call('DEL', marker)
  dlock_listen_drop(base, wid)
  if not dlock_grant_push(base, wid, fence, px) then
    redis.call('PUBLISH', ARGV[4], 'all') -- it finds its hold at its try
  end
  return true
end

-- A read lock to each reader that listens (no writer waits).
-- (Writers' entries are passed over; a reader whose fence cannot be issued
-- is not handed one, nor is any after it: no fence can be issued then.)
local function hand_to_readers()
  for _, l in ipairs(dlock_listeners(base, now, -1)) do
    dlock_grant_zhold(base, l[1], l[2], 'r', readers, rfences, KEYS[2], KEYS[3], window, now)
  end
end

if op == 'read' then
  local score = redis.call('ZSCORE', readers, token)
  redis.call('ZREM', readers, token)
  redis.call('HDEL', rfences, token)
  if not score or tonumber(score) <= now then
    return 0 -- its lease had ended
  end
  dlock_prune(readers, now, nil, rfences)
  if redis.call('ZCARD', readers) == 0 and not hand_to_writer() then
    redis.call('PUBLISH', ARGV[4], 'all')
  end
  return 1
end

if redis.call('GET', base) ~= ARGV[3] then
  return 0
end
local hold = redis.call('HGET', holds, token)
if not hold then
  return 0
end
redis.call('DEL', base, holds)
if op == 'downgrade' then
  local lease = tonumber(ARGV[5])
  redis.call('ZADD', readers, now + lease, token)
  -- The reader keeps the writer's fence and holder record.
  redis.call('HSET', rfences, token,
             dlock_hold_value(dlock_hold_fence(hold), dlock_hold_record(hold), ARGV[6]))
  dlock_pexpire_max(readers, lease)
  dlock_pexpire_max(rfences, lease)
elseif hand_to_writer() then
  return 1
end
if redis.call('EXISTS', marker) == 0 then
  hand_to_readers()
end
redis.call('PUBLISH', ARGV[4], 'all')
return 1
