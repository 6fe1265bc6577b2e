-- SPDX-License-Identifier: BSD-3-Clause
-- Who leads an election.
-- KEYS[1] the base key (see excl_acquire)
-- Returns {held, pttl, identity, fence}.
local holder = redis.call('GET', KEYS[1])
if not holder then
  return {0, 0, '', 0}
end
local fence = tonumber(string.match(redis.call('HGET', KEYS[1] .. ':holds', holder) or '0', '^%d+') or '0')
return {1, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1] .. ':leader') or '', fence}
