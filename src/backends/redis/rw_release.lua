-- SPDX-License-Identifier: BSD-3-Clause
-- Release a read or write lock, or downgrade a write lock to a read lock.
-- KEYS[1] the base key (see rw_acquire)
-- ARGV[1] 'read', 'write' or 'downgrade', ARGV[2] token, ARGV[3] the
-- writer's owner value, ARGV[4] release channel, ARGV[5] lease ms (for
-- downgrade), ARGV[6] owner id ('' for none)
-- Returns 1 done, 0 the lock was not ours (nothing changed). Waiters are
-- woken all at once ('all') when the lock may admit them: readers can share.
-- #include fence
-- #include family
local base, op, token = KEYS[1], ARGV[1], ARGV[2]
local holds, readers, rfences = base .. ':holds', base .. ':readers', base .. ':reader-fences'
local now = dlock_now_ms()

if op == 'read' then
  local score = redis.call('ZSCORE', readers, token)
  redis.call('ZREM', readers, token)
  redis.call('HDEL', rfences, token)
  if not score or tonumber(score) <= now then
    return 0 -- its lease had ended
  end
  dlock_prune(readers, now, nil, rfences)
  if redis.call('ZCARD', readers) == 0 then
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
end
redis.call('PUBLISH', ARGV[4], 'all')
return 1
