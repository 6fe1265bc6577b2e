-- SPDX-License-Identifier: BSD-3-Clause
-- Give a semaphore permit back.
-- KEYS[1] the base key, KEYS[2] the fence floor, KEYS[3] the fence registry
-- ARGV[1] token, ARGV[2] release channel, ARGV[3] the confirm window (ms)
-- Returns 1 when released, 0 when the permit was no longer ours (its lease
-- had ended).
-- The permit goes to the first waiter that listens for its grant (lib/
-- family.lua), as release.lua hands the plain mutex to the waiter in its
-- slot: a permit of its own, with the next fence, for the confirm window
-- (or its lease when shorter), the fence pushed to its list. Otherwise the
-- waiters are woken to try ('released').
-- #include fence
-- #include family
local base, token = KEYS[1], ARGV[1]
local sem, fences = base .. ':sem', base .. ':sem-fences'
local now = dlock_now_ms()
local score = redis.call('ZSCORE', sem, token)
redis.call('ZREM', sem, token)
redis.call('HDEL', fences, token)
if not score or tonumber(score) <= now then
  return 0
end

-- A fence that cannot be issued (a counter that is not an integer, a broken
-- floor) or a push refused leaves the waiters to try, as before.
local function hand_over(wid, entry)
  local k, t, lease, record = dlock_grant_parse(entry)
  if k ~= 's' then
    return false
  end
  local n = tonumber(redis.call('GET', base .. ':permits') or '')
  dlock_prune(sem, now, nil, fences)
  if not n or redis.call('ZCARD', sem) >= n then
    return false -- N was lowered meanwhile
  end
  local fence = dlock_grant_fence(base, KEYS[2], KEYS[3], lease)
  if not fence then
    return false
  end
  local px = math.min(lease, tonumber(ARGV[3]))
  redis.call('ZADD', sem, now + px, t)
  redis.call('HSET', fences, t, dlock_hold_value(fence, record, ''))
  dlock_pexpire_max(sem, px)
  dlock_pexpire_max(fences, px)
  dlock_listen_drop(base, wid)
  return dlock_grant_push(base, wid, fence, px)
end

local first = dlock_listeners(base, now, 1)[1]
if not (first and hand_over(first[1], first[2])) then
  redis.call('PUBLISH', ARGV[2], 'released')
end
return 1
