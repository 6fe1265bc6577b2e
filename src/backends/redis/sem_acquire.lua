-- SPDX-License-Identifier: BSD-3-Clause
-- Take one permit of a semaphore.
-- KEYS[1] the base key, KEYS[2] the fence floor, KEYS[3] the fence registry
-- ARGV[1] token, ARGV[2] lease ms, ARGV[3] N to set when none is stored (0: none),
-- ARGV[4] the holder record ('' for none), ARGV[5] a waiter's id ('' for a
-- try), ARGV[6] its registration's expiry W in ms, ARGV[7] '1' when it
-- listens for its grant (lib/family.lua: a waiter that listens is registered
-- while busy, and sem_release hands it a permit given back)
-- Keys: base:sem = token -> expiry (server time), base:sem-fences = token ->
-- "FENCE HOLDER\n" (lib/family.lua, dlock_hold_value), base:permits = N
-- (kept DLOCK_RETENTION_MS past the last acquisition).
-- Returns {1, fence}, {0, ms until the first permit's lease ends}, or
-- {-2, 1} when no N is stored and none given.
-- #include fence
-- #include family
local base, token, lease = KEYS[1], ARGV[1], tonumber(ARGV[2])
local sem, fences, permits = base .. ':sem', base .. ':sem-fences', base .. ':permits'
local counter = base .. ':fence'

local count = redis.call('GET', counter)
local err = dlock_fence_check(counter, count)
if err then
  return err
end
local now = dlock_now_ms()
dlock_prune(sem, now, nil, fences)
local wid, ttl = ARGV[5] or '', tonumber(ARGV[6] or '0')
local mine = redis.call('HGET', fences, token)
if mine then
  -- A retry after a lost reply, or a permit a release handed us (for the
  -- confirm window): ours for the whole lease from this try.
  dlock_zhold_keep(sem, fences, token, now, lease)
  if wid ~= '' then
    dlock_listen_drop(base, wid)
  end
  return {1, dlock_hold_fence(mine)}
end

local keep = math.max(DLOCK_RETENTION_MS, 10 * lease)
local n = tonumber(redis.call('GET', permits) or '')
if not n then
  n = tonumber(ARGV[3])
  if n <= 0 then
    return {-2, 1}
  end
  redis.call('SET', permits, n, 'PX', keep)
elseif redis.call('PTTL', permits) < keep / 2 then
  redis.call('PEXPIRE', permits, keep)
end
if redis.call('ZCARD', sem) >= n then
  local first = redis.call('ZRANGE', sem, 0, 0, 'WITHSCORES')
  local retry = first[2] and math.max(0, tonumber(first[2]) - now) or -1
  if wid ~= '' then
    if ARGV[7] == '1' then
      dlock_listen_add(base, wid, dlock_grant_entry('s', token, ARGV[2], ARGV[4], ''), ttl, now)
      if retry < 0 or retry > dlock_refresh_ms(ttl) then
        retry = dlock_refresh_ms(ttl) -- come back before the registration expires
      end
    else
      dlock_listen_drop(base, wid) -- a waiter that stopped listening
    end
  end
  return {0, retry}
end
local fence
fence, err = dlock_fence_next(counter, count, KEYS[2], KEYS[3], lease)
if not fence then
  return err
end
dlock_zhold_set(sem, fences, token, fence, ARGV[4], '', now, lease)
if wid ~= '' then
  dlock_listen_drop(base, wid)
end
return {1, fence}
