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
--
-- A waiter whose entry ends " L[ HOLDER]" listens: it keeps a BLPOP of its
-- own list, KEYS[1] .. ':grant:' .. WAITER-ID, outstanding (redis_listen.c).
-- The release then also RPUSHes the fence there, and the key gets the
-- waiter's record: that waiter holds the lock when it pops the fence, with
-- no try of its own, and counts the lease from the send of its last BLPOP
-- answered empty (or of its wait's first try), for the confirm window at
-- most, as the key lives (docs/verification.md, "A grant pushed to a
-- list"). No message is published then, so no subscriber thread wakes
-- for it: the waiter confirms nothing, and a waiter that stops listening
-- (a BLPOP refused, a connection lost) tries at once, which finds a lock
-- handed to it, and replaces its entry with one that does not listen
-- (acquire.lua). Were it dead, the others find the lock free at their
-- next try after the window, as after a holder's death. A push that is
-- refused (an ACL without RPUSH) leaves the plain grant's message.
-- The value is "TOKEN HOLDER" (acquire.lua), or the bare token of a
-- hand-off not confirmed yet: the holder record goes with the value, and a
-- waiter handed the lock writes its own when it confirms.
local held = redis.call('GET', KEYS[1])
if not held or (held ~= ARGV[1] and string.sub(held, 1, #ARGV[1] + 1) ~= ARGV[1] .. ' ') then
  return 0
end
local entry = redis.call('GET', KEYS[5])
if entry then
  redis.call('DEL', KEYS[5])
  local wid, token, lease, rest = string.match(entry, '^(%x+) (%x+) (%d+)(.*)$')
  local listens = rest == ' L' or (rest and string.sub(rest, 1, 3) == ' L ')
  if wid and (rest == '' or listens) then
    -- The fence as the plain acquire issues it (acquire.lua): INCR, and
    -- the helpers (lib/fence.lua) only for a counter INCR just made, which
    -- starts at the floor, or one token in 16, which keeps the registry,
    -- so that the common hand-over does not pay for making their closures.
    -- A counter that is not an integer, or past DLOCK_FENCE_MAX, makes the
    -- release a plain one.
    local ok, fence = pcall(redis.call, 'INCR', KEYS[2])
    if not ok or fence > 9007199254740991 then
      fence = nil
    elseif fence == 1 or fence % 16 == 0 then
      -- #include fence
      local incr = fence
      local ok2, f2 = pcall(dlock_fence_after_incr, KEYS[2], incr, KEYS[3], KEYS[4],
                            tonumber(lease))
      fence = ok2 and f2 or nil
      if not fence and incr == 1 then
        redis.call('DEL', KEYS[2])
      end
    end
    if fence then
      -- A waiter that listens confirms nothing: its record goes in now.
      local px = math.min(tonumber(lease), tonumber(ARGV[3]))
      redis.call('SET', KEYS[1], #rest > 3 and token .. string.sub(rest, 3) or token, 'PX', px)
      if listens then
        local list = KEYS[1] .. ':grant:' .. wid
        if pcall(redis.call, 'RPUSH', list, fence) then
          redis.call('PEXPIRE', list, px)
          return 1
        end
      end
      redis.call('PUBLISH', ARGV[2], 'grant ' .. wid .. ' ' .. fence)
      return 1
    end
  end
end
-- No waiter to hand over to, or the hand-over failed: a plain release.
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], 'released')
return 1
