-- A waiter gives up: leave the fair queue, drop a writer-waiting marker.
-- KEYS[1] the base key; ARGV[1] the waiter's token, ARGV[2] release channel
-- If it was first in a free fair lock's queue, it may have been woken for a
-- turn it will not take: the next waiter is woken instead. Readers held back
-- by its marker are woken. Returns 1.
-- #include fence
-- #include family
local base, token = KEYS[1], ARGV[1]
local queue, qexp = base .. ':queue', base .. ':queue-exp'
local was_head = redis.call('ZRANGE', queue, 0, 0)[1] == token
redis.call('ZREM', queue, token)
redis.call('ZREM', qexp, token)
if was_head and not redis.call('GET', base) then
  dlock_prune(qexp, dlock_now_ms(), queue, nil)
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if head then
    redis.call('PUBLISH', ARGV[2], head)
  end
end
if redis.call('GET', base .. ':writer-wait') == token then
  redis.call('DEL', base .. ':writer-wait')
  redis.call('PUBLISH', ARGV[2], 'all')
end
return 1
