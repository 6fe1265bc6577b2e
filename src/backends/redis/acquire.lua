-- SPDX-License-Identifier: BSD-3-Clause
-- Take the lock and issue its fence in one round trip.
-- KEYS[1] the lock, KEYS[2] its fence counter, KEYS[3] the fence floor,
-- KEYS[4] the fence registry, KEYS[5] the hand-off slot
-- ARGV[1] owner token, ARGV[2] lease in ms, ARGV[3] the holder record
-- ("HOST PID START_MS[ LABEL]", '' for none), kept in the lock's value after
-- the token, "TOKEN HOLDER" (status.lua shows it): no key or command of its
-- own, and it goes with the lock; when the caller waits, also
-- ARGV[4] its hand-off entry "WAITER-ID TOKEN LEASE", or "WAITER-ID TOKEN
-- LEASE L[ HOLDER]" for a waiter that listens (release.lua), and ARGV[5] how long
-- the entry lasts (ms) unless the waiter comes back
-- Returns {1, fence} when the caller holds the lock, {2, fence} when it
-- confirmed a lock a release handed it, {0, pttl} when another owner does,
-- {0, pttl, 1} when another does and the caller's entry is in the slot.
-- A waiter that finds the lock busy takes the hand-off slot if it is free
-- (or renews it if it is its own): the release then gives the lock to it
-- directly (release.lua), with no retry round trip.
local entry = ARGV[4]
local value = ARGV[3] ~= '' and ARGV[1] .. ' ' .. ARGV[3] or ARGV[1]
if redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then
  -- INCR, never SET: the counter only grows, also across expiries of the lock key.
  -- If issuing the fence fails (a counter that is not an integer, an ACL
  -- without INCR, a broken floor, a full server), the lock is taken back:
  -- no lock is ever left without a fence.
  local ok, fence = pcall(redis.call, 'INCR', KEYS[2])
  if not ok then
    redis.call('DEL', KEYS[1])
    local msg = type(fence) == 'table' and fence.err or tostring(fence)
    if string.find(msg, 'not an integer', 1, true) then
      msg = 'DLOCKFENCE fence counter ' .. KEYS[2] .. ' is not an integer (or out of range)'
    end
    return redis.error_reply(msg)
  end
  if fence > 9007199254740991 then
    -- DLOCK_FENCE_MAX (lib/fence.lua): past it, Lua would round the fence.
    redis.call('DEL', KEYS[1])
    return redis.error_reply('DLOCKFENCE fence counter ' .. KEYS[2] .. ' would pass ' ..
                             '9007199254740991 (2^53 - 1), the highest fence the scripts ' ..
                             'hold exactly')
  end
  if fence == 1 or fence % 16 == 0 then
    -- A counter INCR just created starts at the floor, and one token in 16
    -- keeps the registry (lib/fence.lua, DLOCK_UPKEEP_EVERY): only then are
    -- the helpers defined, so the common acquisition does not pay for them.
    -- #include fence
    local incr = fence
    local ok2, ferr
    ok2, fence, ferr = pcall(dlock_fence_after_incr, KEYS[2], incr, KEYS[3], KEYS[4],
                             tonumber(ARGV[2]))
    if not ok2 or not fence then
      if incr == 1 then
        redis.call('DEL', KEYS[2])
      end
      redis.call('DEL', KEYS[1])
      if ok2 then
        return ferr
      end
      -- (fence is what redis.call raised: a table with err, or a message.)
      return redis.error_reply(type(fence) == 'table' and fence.err or tostring(fence))
    end
  end
  if entry and redis.call('GET', KEYS[5]) == entry then
    redis.call('DEL', KEYS[5])
  end
  return {1, fence}
end
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] or held == value then
  -- A retry after a lost reply, or a waiter confirming the lock a release
  -- handed it (release.lua): the key is ours, so nobody has taken a fence
  -- since ours and the counter holds it. If the counter was retired
  -- meanwhile (lib/fence.lua), the floor was raised to at least its value
  -- and the next token of this name will be above the floor: the floor is
  -- then a fence no other holder of this name can have or get.
  local fence = tonumber(redis.call('GET', KEYS[2]) or redis.call('GET', KEYS[3]))
  if not fence or fence <= 0 then
    return redis.error_reply('DLOCKFENCE neither the fence counter ' .. KEYS[2] ..
                             ' nor the floor ' .. KEYS[3] .. ' holds the fence of a held lock')
  end
  -- A hand-off sets the bare token (release.lua): the record then tells a
  -- confirmation, which writes it, from a retry after a lost reply.
  local handed = held ~= value
  redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
  return {handed and 2 or 1, fence}
end
if entry then
  if redis.call('SET', KEYS[5], entry, 'NX', 'PX', ARGV[5]) then
    return {0, redis.call('PTTL', KEYS[1]), 1}
  end
  local cur = redis.call('GET', KEYS[5])
  if cur == entry then
    redis.call('PEXPIRE', KEYS[5], ARGV[5])
    return {0, redis.call('PTTL', KEYS[1]), 1}
  end
  -- Our own entry, of when we listened (redis_listen.c): this one does not.
  local wid = string.match(entry, '^%x+ ')
  if cur and wid and string.sub(cur, 1, #wid) == wid then
    redis.call('SET', KEYS[5], entry, 'PX', ARGV[5])
    return {0, redis.call('PTTL', KEYS[1]), 1}
  end
end
return {0, redis.call('PTTL', KEYS[1])}
