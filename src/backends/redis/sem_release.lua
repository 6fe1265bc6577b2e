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

-- N lowered meanwhile, a fence that cannot be issued (a counter that is not
-- an integer, a broken floor) or a push refused leaves the waiters to try,
-- as before.
local function hand_over(wid, entry)
  local n = tonumber(redis.call('GET', base .. ':permits') or '')
  dlock_prune(sem, now, nil, fences)
  if not n or redis.call('ZCARD', sem) >= n then
    return false
  end
  return dlock_grant_zhold(base, wid, entry, 's', sem, fences, KEYS[2], KEYS[3],
                           tonumber(ARGV[3]), now)
end

local first = dlock_listeners(base, now, 1)[1]
if not (first and hand_over(first[1], first[2])) then
  redis.call('PUBLISH', ARGV[2], 'released')
end
return 1
