-- SPDX-License-Identifier: BSD-3-Clause
-- Compare-and-delete: only the owner may release, and waiters are told.
-- KEYS[1] the lock, KEYS[2] its fence counter, KEYS[3] the fence floor,
-- KEYS[4] the fence registry, KEYS[5] the hand-off slot
-- ARGV[1] owner token, ARGV[2] release channel, ARGV[3] the confirm window (ms)
-- Returns 1 when released, 0 when the lock was not ours (nothing deleted).
--
-- When a waiter holds the hand-off slot (acquire.lua), the lock goes to it
-- here, fence and all, and the message "grant WAITER-ID FENCE" wakes it.
-- The grant is only a wake-up: the waiter holds the lock once its next try
-- finds its own token in the key (acquire.lua renews it to the full lease
-- and the waiter counts the lease from that try). Until then the key lives
-- for the confirm window, not the waiter's lease, so a waiter that died or
-- stalled keeps the lock from others for the window at most, and a grant
-- that arrives late can never be taken for a lease the server does not keep.
-- Otherwise the message "released" wakes a waiter to try.
-- The value is "TOKEN HOLDER" (acquire.lua), or the bare token of a
-- hand-off not confirmed yet: the holder record goes with the value, and a
-- waiter handed the lock writes its own when it confirms.
local held = redis.call('GET', KEYS[1])
if not held or (held ~= ARGV[1] and string.sub(held, 1, #ARGV[1] + 1) ~= ARGV[1] .. ' ') then
  return 0
end
local entry = redis.call('GET', KEYS[5])
if entry then
  -- The fence helpers are defined here, not at the top: a release with no
  -- waiter (the common case) does not pay for making their closures.
  -- #include fence
  redis.call('DEL', KEYS[5])
  local wid, token, lease = string.match(entry, '^(%x+) (%x+) (%d+)$')
  local counter = redis.call('GET', KEYS[2])
  if wid and not dlock_fence_check(KEYS[2], counter) then
    redis.call('SET', KEYS[1], token, 'PX', math.min(tonumber(lease), tonumber(ARGV[3])))
    local ok, fence = pcall(dlock_fence_next, KEYS[2], counter, KEYS[3], KEYS[4],
                            tonumber(lease))
    if ok and fence then
      redis.call('PUBLISH', ARGV[2], 'grant ' .. wid .. ' ' .. fence)
      return 1
    end
  end
end
-- No waiter to hand over to, or the hand-over failed: a plain release.
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], 'released')
return 1
