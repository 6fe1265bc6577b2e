-- Redlock round 1 on one node: take the lock for a token, and say what
-- fence this node has seen (docs/redlock.md).
-- KEYS[1] the lock, KEYS[2] the node's fence high-water mark
-- ARGV[1] token, ARGV[2] lease in ms (the node's PX: lease + drift)
-- Returns {1, high-water} when the key is now ours (set, or ours already,
-- a retry: its expiry is set again), {0, pttl} when another token holds it.
-- The high-water mark is only read here: round 2 (confirm.lua) raises it.
local hw = redis.call('GET', KEYS[2])
if hw and not string.match(hw, '^%d+$') then
  return redis.error_reply('DLOCKFENCE fence high-water mark ' .. KEYS[2] ..
                           ' is not a non-negative integer')
end
hw = tonumber(hw or '0')
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, hw}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, hw}
end
return {0, redis.call('PTTL', KEYS[1])}
