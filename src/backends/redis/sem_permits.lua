-- SPDX-License-Identifier: BSD-3-Clause
-- Set a semaphore's number of permits and wake its waiters.
-- KEYS[1] the base key; ARGV[1] N, ARGV[2] release channel. Returns 1.
-- #include fence
local permits = KEYS[1] .. ':permits'
redis.call('SET', permits, ARGV[1], 'PX', math.max(DLOCK_RETENTION_MS, redis.call('PTTL', permits)))
redis.call('PUBLISH', ARGV[2], 'all')
return 1
