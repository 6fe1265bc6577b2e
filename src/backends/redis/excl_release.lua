-- SPDX-License-Identifier: BSD-3-Clause
-- Release one hold of an exclusive lock of the family (see excl_acquire).
-- KEYS[1] the base key
-- ARGV[1] kind, ARGV[2] token, ARGV[3] owner value, ARGV[4] the release
-- channel, ARGV[5] the leader channel
-- Returns 1 when released, 0 when the hold was not ours (nothing changed).
-- A fair lock wakes only the waiter at the head of its queue, by publishing
-- that waiter's id (never a token: see excl_acquire); the others wake the
-- waiters with 'released'.
-- #include fence
-- #include family
local base, kind, token = KEYS[1], ARGV[1], ARGV[2]
local holds = base .. ':holds'
if redis.call('GET', base) ~= ARGV[3] or redis.call('HEXISTS', holds, token) == 0 then
  return 0
end
redis.call('HDEL', holds, token)
if redis.call('HLEN', holds) > 0 then
  return 1 -- the owner's other holds keep the lock
end
redis.call('DEL', base)
if kind == 'leader' then
  redis.call('DEL', base .. ':leader')
  redis.call('PUBLISH', ARGV[5], 'all')
end
if kind == 'fair' then
  local queue, qexp = base .. ':queue', base .. ':queue-exp'
  dlock_prune(qexp, dlock_now_ms(), queue, nil)
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if head then
    redis.call('PUBLISH', ARGV[4], head)
  end
else
  redis.call('PUBLISH', ARGV[4], 'released')
end
return 1
