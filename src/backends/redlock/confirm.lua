-- SPDX-License-Identifier: BSD-3-Clause
-- Redlock round 2 on one node: record the fence while the key is ours, so
-- that the next holder's majority, which meets ours in at least one node,
-- reads it there (docs/redlock.md, "Why the fence increases").
-- KEYS[1] the lock, KEYS[2] the node's fence high-water mark
-- ARGV[1] token, ARGV[2] the fence, ARGV[3] the owner id ('' for the plain
-- mutex; with one, the key holds it and KEYS[1]:holds the handle's token)
-- Returns 1 when the key is ours (the mark is now >= the fence, and an
-- owner's hold records it), 0 when not (nothing written).
local holds = KEYS[1] .. ':holds'
if ARGV[3] == '' then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
  end
elseif redis.call('GET', KEYS[1]) ~= ARGV[3] or redis.call('HEXISTS', holds, ARGV[1]) == 0 then
  return 0
else
  redis.call('HSET', holds, ARGV[1], ARGV[2])
end
local hw = tonumber(redis.call('GET', KEYS[2]) or '0')
if not hw or hw < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
