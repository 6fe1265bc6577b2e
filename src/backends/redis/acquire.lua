-- Take the lock and issue its fence in one round trip.
-- KEYS[1] the lock, KEYS[2] its fence counter
-- ARGV[1] owner token, ARGV[2] lease in ms
-- Returns {1, fence} when the caller holds the lock, {0, pttl} when another owner does.
local counter = redis.call('GET', KEYS[2])
if counter and not tonumber(counter) then
  -- Checked before the SET so that a broken counter never leaves a lock without a fence.
  return redis.error_reply('DLOCKFENCE fence counter ' .. KEYS[2] .. ' is not an integer')
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- INCR, never SET: the counter only grows, also across expiries of the lock key.
  return {1, redis.call('INCR', KEYS[2])}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  -- A retry after a lost reply: the key is still ours, so nobody has taken a
  -- fence since ours and the counter holds it.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(counter)}
end
return {0, redis.call('PTTL', KEYS[1])}
