-- SPDX-License-Identifier: BSD-3-Clause
-- Release one hold of an exclusive lock of the family (see excl_acquire).
-- KEYS[1] the base key, KEYS[2] the fence floor, KEYS[3] the fence registry
-- ARGV[1] kind, ARGV[2] token, ARGV[3] owner value, ARGV[4] the release
-- channel, ARGV[5] the leader channel, ARGV[6] the confirm window (ms)
-- Returns 1 when released, 0 when the hold was not ours (nothing changed).
-- A fair lock goes to the waiter at the head of its queue. When that waiter
-- listens (its entry in base:queue-grant, excl_acquire), the lock is handed
-- to it here, fence and all, as release.lua hands a plain mutex to the
-- waiter in its slot: the keys live for the confirm window (or the lease
-- when shorter) and the fence is pushed to PREFIX{NAME}:grant:WAITER-ID,
-- where the waiter's BLPOP takes it (redis_listen.c; the lease counts from
-- the send of its last BLPOP answered empty, or of the try that wrote its
-- entry). Otherwise the release wakes that waiter alone by publishing its
-- id (never a token: see excl_acquire), and the waiter tries. The other
-- kinds wake the waiters with 'released'.
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
if kind ~= 'fair' then
  redis.call('PUBLISH', ARGV[4], 'released')
  return 1
end

local queue, qexp, grants = base .. ':queue', base .. ':queue-exp', base .. ':queue-grant'
dlock_prune(qexp, dlock_now_ms(), queue, grants)
local head = redis.call('ZRANGE', queue, 0, 0)[1]
if not head then
  return 1
end

-- Hand the lock to the head that listens. A fence that cannot be issued (a
-- counter that is not an integer, a broken floor) or a push refused (an ACL
-- without RPUSH) leaves the head to try, which then reports the error, or
-- finds the lock handed to it and confirms it (excl_acquire).
local function hand_over(entry)
  local fence, px = dlock_grant_hold(base, entry, 'f', 'fair', KEYS[2], KEYS[3], tonumber(ARGV[6]))
  if not fence then
    return false
  end
  redis.call('ZREM', queue, head)
  redis.call('ZREM', qexp, head)
  redis.call('HDEL', grants, head)
  return dlock_grant_push(base, head, fence, px)
end

local entry = redis.call('HGET', grants, head)
if not (entry and hand_over(entry)) then
  redis.call('PUBLISH', ARGV[4], head)
end
return 1
