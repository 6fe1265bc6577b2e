-- Compare-and-delete: only the owner may release, and waiters are told.
-- KEYS[1] the lock; ARGV[1] owner token, ARGV[2] release channel
-- Returns 1 when released, 0 when the lock was not ours (nothing deleted).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
