-- SPDX-License-Identifier: BSD-3-Clause
-- Read a lock's state; with ARGV[1] = 'force', also break it and wake waiters.
-- KEYS[1] the lock, KEYS[2] its fence counter; ARGV[2] release channel
-- Returns {held, pttl, fence, holder}: holder is the record acquire.lua
-- keeps in KEYS[1] .. ':holder' ('' when none, or when not held).
local held = redis.call('EXISTS', KEYS[1])
local pttl = redis.call('PTTL', KEYS[1])
local fence = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local record = KEYS[1] .. ':holder'
local holder = held == 1 and redis.call('GET', record) or ''
if ARGV[1] == 'force' and held == 1 then
  redis.call('DEL', KEYS[1], record)
  redis.call('PUBLISH', ARGV[2], 'released')
end
return {held, pttl, fence, holder or ''}
