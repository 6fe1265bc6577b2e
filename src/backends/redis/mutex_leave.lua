-- SPDX-License-Identifier: BSD-3-Clause
-- A waiter of the plain mutex gives up: it leaves the hand-off slot, and if
-- a release handed it the lock after its last try, it passes the lock on
-- as a release would (the next waiter tries).
-- KEYS[1] the lock (its hand-off slot is KEYS[1] .. ':next')
-- ARGV[1] the waiter's owner token, ARGV[2] release channel, ARGV[3] its entry
-- Returns 1 when it gave back a lock it had been handed, else 0.
local slot = KEYS[1] .. ':next'
local cur = redis.call('GET', slot)
-- Ours, or ours of when we listened (redis_listen.c): the same waiter id.
local wid = string.match(ARGV[3], '^%x+ ')
if cur and (cur == ARGV[3] or (wid and string.sub(cur, 1, #wid) == wid)) then
  redis.call('DEL', slot)
end
-- The value is its bare token (handed to it) or "TOKEN HOLDER" (a try
-- whose reply was lost took it).
local held = redis.call('GET', KEYS[1])
if held and (held == ARGV[1] or string.sub(held, 1, #ARGV[1] + 1) == ARGV[1] .. ' ') then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
