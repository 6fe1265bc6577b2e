-- SPDX-License-Identifier: BSD-3-Clause
-- Compare-and-delete on one node, and tell its waiters: those that found the
-- key busy here set KEYS[1]:waiters (acquire.lua); without one, nothing is
-- published.
-- KEYS[1] the lock; ARGV[1] token, ARGV[2] release channel, ARGV[3] the
-- owner id ('' for the plain mutex)
-- Returns 1 when our hold is gone (the key deleted, or only our hold when
-- the owner's other holds keep it), 0 when it was not ours (nothing
-- changed).
if ARGV[3] == '' then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
  end
else
  local holds = KEYS[1] .. ':holds'
  if redis.call('GET', KEYS[1]) ~= ARGV[3] or redis.call('HDEL', holds, ARGV[1]) == 0 then
    return 0
  end
  if redis.call('HLEN', holds) > 0 then
    return 1
  end
end
if redis.call('DEL', KEYS[1], KEYS[1] .. ':waiters') == 2 then
  redis.call('PUBLISH', ARGV[2], 'released')
end
return 1
