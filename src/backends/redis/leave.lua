-- SPDX-License-Identifier: BSD-3-Clause
-- A waiter gives up: leave the fair queue, drop a writer-waiting marker.
-- KEYS[1] the base key; ARGV[1] the waiter's id (its place in the fair queue
-- and its writer marker, see excl_acquire), ARGV[2] release channel; for a
-- fair waiter that listened for its grant, ARGV[3] its owner token and
-- ARGV[4] its owner value.
-- If it was first in a free fair lock's queue, it may have been woken for a
-- turn it will not take: the next waiter is woken instead. A lock a release
-- handed it after its last try (excl_release) is given back, and the next
-- waiter woken. Readers held back by its marker are woken. Returns 1.
-- #include fence
-- #include family
local base, wid = KEYS[1], ARGV[1]
local queue, qexp = base .. ':queue', base .. ':queue-exp'
local was_head = redis.call('ZRANGE', queue, 0, 0)[1] == wid
redis.call('ZREM', queue, wid)
redis.call('ZREM', qexp, wid)
redis.call('HDEL', base .. ':queue-grant', wid)
if ARGV[3] and redis.call('GET', base) == ARGV[4] then
  local holds = base .. ':holds'
  if redis.call('HDEL', holds, ARGV[3]) == 1 and redis.call('HLEN', holds) == 0 then
    redis.call('DEL', base)
    was_head = true
  end
end
if was_head and not redis.call('GET', base) then
  dlock_prune(qexp, dlock_now_ms(), queue, base .. ':queue-grant')
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if head then
    redis.call('PUBLISH', ARGV[2], head)
  end
end
if redis.call('GET', base .. ':writer-wait') == wid then
  redis.call('DEL', base .. ':writer-wait')
  redis.call('PUBLISH', ARGV[2], 'all')
end
return 1
