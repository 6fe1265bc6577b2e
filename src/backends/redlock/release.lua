-- Compare-and-delete on one node, and tell its waiters.
-- KEYS[1] the lock; ARGV[1] token, ARGV[2] release channel
-- Returns 1 when deleted, 0 when the key was not ours (nothing changed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], 'released')
return 1
