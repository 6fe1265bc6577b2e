-- SPDX-License-Identifier: BSD-3-Clause
-- Keep the places of many fair waiters of one client in one round trip
-- (redis_places.c), instead of a try of each waiter each third of its
-- place's expiry.
-- KEYS[1..n] the base keys; ARGV[2i-1] waiter i's id, ARGV[2i] its place's
-- expiry in ms
-- Returns a string of n characters: '1' when waiter i should try now (it
-- heads the queue of a free lock, or its place is gone: its try queues it
-- again), else '0' (its place now lasts another expiry).
-- #include fence
-- #include family
local now = dlock_now_ms()
local out = {}
for i = 1, #KEYS do
  local base, wid, ttl = KEYS[i], ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local queue, qexp, grants = base .. ':queue', base .. ':queue-exp', base .. ':queue-grant'
  local v = '1'
  dlock_prune(qexp, now, queue, grants)
  if redis.call('ZSCORE', queue, wid) then
    redis.call('ZADD', qexp, now + ttl, wid)
    dlock_pexpire_max(queue, ttl)
    dlock_pexpire_max(qexp, ttl)
    dlock_pexpire_max(grants, ttl)
    if redis.call('EXISTS', base) == 1 or redis.call('ZRANGE', queue, 0, 0)[1] ~= wid then
      v = '0'
    end
  end
  out[i] = v
end
return table.concat(out)
