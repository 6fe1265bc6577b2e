-- SPDX-License-Identifier: BSD-3-Clause
-- Compare-and-pexpire.
-- KEYS[1] the lock, whose value is "TOKEN[ HOLDER]" (acquire.lua); ARGV[1]
-- owner token, ARGV[2] lease in ms
-- Returns 1 when extended, 0 when the lock was not ours.
local held = redis.call('GET', KEYS[1])
if held and (held == ARGV[1] or string.sub(held, 1, #ARGV[1] + 1) == ARGV[1] .. ' ') then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
