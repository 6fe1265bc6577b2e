-- Take the lock and issue its fence in one round trip.
-- KEYS[1] the lock, KEYS[2] its fence counter, KEYS[3] the fence floor,
-- KEYS[4] the fence registry
-- ARGV[1] owner token, ARGV[2] lease in ms
-- Returns {1, fence} when the caller holds the lock, {0, pttl} when another owner does.
-- #include fence
local counter = redis.call('GET', KEYS[2])
-- Checked before anything is written, so that a broken counter never leaves a
-- lock without a fence.
local err = dlock_fence_check(KEYS[2], counter)
if err then
  return err
end
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  -- A retry after a lost reply: the key is still ours, so nobody has taken a
  -- fence since ours and the counter holds it.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(counter) or 0}
end
if holder then
  return {0, redis.call('PTTL', KEYS[1])}
end
-- The fence first: if issuing it fails (an ACL without INCR, a full server),
-- the script stops before the lock exists, and no lock is left without a fence.
-- INCR, never SET: the counter only grows, also across expiries of the lock key.
local fence
fence, err = dlock_fence_next(KEYS[2], counter, KEYS[3], KEYS[4], tonumber(ARGV[2]))
if not fence then
  return err
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, fence}
