-- SPDX-License-Identifier: BSD-3-Clause
-- A waiter gives up: leave the fair queue, drop a writer-waiting marker and
-- the registration of a waiter that listens (lib/family.lua).
-- KEYS[1] the base key; ARGV[1] the waiter's id (its place in the fair queue
-- and its writer marker, see excl_acquire), ARGV[2] release channel; for a
-- waiter that listened for its grant, ARGV[3] its owner token and ARGV[4]
-- its owner value (a fair waiter's or a writer's).
-- If it was first in a free fair lock's queue, it may have been woken for a
-- turn it will not take: the next waiter is woken instead. A lock a release
-- handed it after its last try (excl_release, rw_release, sem_release: a
-- hold, a read lock or a permit with its token) is given back, and the
-- waiters woken. Readers held back by its marker are woken. Returns 1.
-- #include fence
-- #include family
local base, wid, token = KEYS[1], ARGV[1], ARGV[3]
local queue, qexp = base .. ':queue', base .. ':queue-exp'
local was_head = redis.call('ZRANGE', queue, 0, 0)[1] == wid
local wake = nil
redis.call('ZREM', queue, wid)
redis.call('ZREM', qexp, wid)
redis.call('HDEL', base .. ':queue-grant', wid)
dlock_listen_drop(base, wid)
if token then
  local holds = base .. ':holds'
  local hold = redis.call('GET', base) == ARGV[4] and redis.call('HGET', holds, token)
  if hold then
    redis.call('HDEL', holds, token)
    if redis.call('HLEN', holds) == 0 then
      redis.call('DEL', base)
      -- The fair lock's next waiter is named (below), a writer's woken.
      if dlock_hold_rest(hold) == 'fair' then
        was_head = true
      else
        wake = 'all'
      end
    end
  end
  if redis.call('ZREM', base .. ':readers', token) == 1 then
    redis.call('HDEL', base .. ':reader-fences', token)
    wake = 'all'
  end
  if redis.call('ZREM', base .. ':sem', token) == 1 then
    redis.call('HDEL', base .. ':sem-fences', token)
    wake = 'released'
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
  wake = 'all'
end
if wake then
  redis.call('PUBLISH', ARGV[2], wake)
end
return 1
