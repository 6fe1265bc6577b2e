-- A waiter of the plain mutex gives up: it leaves the hand-off slot, and if
-- a release handed it the lock after its last try, it passes the lock on
-- as a release would (the next waiter tries).
-- KEYS[1] the lock, KEYS[2] the hand-off slot
-- ARGV[1] the waiter's entry, ARGV[2] its owner token, ARGV[3] release channel
-- Returns 1 when it gave back a lock it had been handed, else 0.
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
if redis.call('GET', KEYS[1]) == ARGV[2] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], 'released')
  return 1
end
return 0
