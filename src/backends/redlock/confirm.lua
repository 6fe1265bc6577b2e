-- Redlock round 2 on one node: record the fence while the key is ours, so
-- that the next holder's majority, which meets ours in at least one node,
-- reads it there (docs/redlock.md, "Why the fence increases").
-- KEYS[1] the lock, KEYS[2] the node's fence high-water mark
-- ARGV[1] token, ARGV[2] the fence
-- Returns 1 when the key is ours (the mark is now >= the fence), 0 when not
-- (nothing written).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local hw = tonumber(redis.call('GET', KEYS[2]) or '0')
if not hw or hw < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
