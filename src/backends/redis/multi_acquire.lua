-- SPDX-License-Identifier: BSD-3-Clause
-- Take several plain locks in one hash slot, all or none, in one step.
-- KEYS[1..n] the locks (PREFIX{NAME}), KEYS[n+1] the fence floor,
-- KEYS[n+2] the fence registry; on a cluster KEYS[n+3..2n+2] their fence
-- counters, declared only (redis_family.c, declare_state): n is told by
-- ARGV
-- ARGV[1..n] the owner token of each, ARGV[n+1] lease ms, ARGV[n+2] the
-- holder record ('' for none), kept in each lock's value as acquire.lua
-- does ("TOKEN HOLDER")
-- Returns {1, fence_1, ..., fence_n}, or {0, i, pttl} when lock i is held
-- by another owner (then nothing was written).
-- #include fence
local n = #ARGV - 2
local floor, registry, lease = KEYS[n + 1], KEYS[n + 2], tonumber(ARGV[n + 1])
local record = ARGV[n + 2] or ''
local holders, counts = {}, {}
for i = 1, n do
  local counter = KEYS[i] .. ':fence'
  counts[i] = redis.call('GET', counter)
  local err = dlock_fence_check(counter, counts[i])
  if err then
    return err
  end
  holders[i] = redis.call('GET', KEYS[i])
  if holders[i] and holders[i] ~= ARGV[i] and
     string.sub(holders[i], 1, #ARGV[i] + 1) ~= ARGV[i] .. ' ' then
    return {0, i, redis.call('PTTL', KEYS[i])}
  end
end
local out, upkeep = {1}, {}
-- Every token first (a broken floor stops the script before any lock is
-- set), then the locks, then the registry: retiring must come after all
-- the counters this script read.
for i = 1, n do
  if holders[i] then -- a retry after a lost reply: ours already
    out[i + 1] = tonumber(counts[i]) or 0
  else
    local fence, err = dlock_fence_issue(KEYS[i] .. ':fence', counts[i], floor)
    if not fence then
      return err
    end
    out[i + 1] = fence
    upkeep[i] = dlock_fence_upkeep(counts[i], fence)
  end
end
local clock = nil
for i = 1, n do
  if holders[i] then
    redis.call('PEXPIRE', KEYS[i], lease)
  else
    redis.call('SET', KEYS[i], record ~= '' and ARGV[i] .. ' ' .. record or ARGV[i], 'PX', lease)
  end
  if upkeep[i] then
    clock = clock or dlock_registry_clock(registry)
    dlock_fence_note(KEYS[i] .. ':fence', registry, clock, lease)
  end
end
dlock_fence_retire(floor, registry, clock)
return out
