-- SPDX-License-Identifier: BSD-3-Clause
-- Give a semaphore permit back.
-- KEYS[1] the base key; ARGV[1] token, ARGV[2] release channel
-- Returns 1 when released, 0 when the permit was no longer ours (its lease
-- had ended).
-- #include fence
local base, token = KEYS[1], ARGV[1]
local sem = base .. ':sem'
local score = redis.call('ZSCORE', sem, token)
redis.call('ZREM', sem, token)
redis.call('HDEL', base .. ':sem-fences', token)
if not score or tonumber(score) <= dlock_now_ms() then
  return 0
end
redis.call('PUBLISH', ARGV[2], 'released')
return 1
