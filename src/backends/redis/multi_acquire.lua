-- Take several plain locks in one hash slot, all or none, in one step.
-- KEYS[1..n] the locks (PREFIX{NAME}), KEYS[n+1] the fence floor,
-- KEYS[n+2] the fence registry
-- ARGV[1..n] the owner token of each, ARGV[n+1] lease ms
-- Returns {1, fence_1, ..., fence_n}, or {0, i, pttl} when lock i is held
-- by another owner (then nothing was written).
-- #include fence
local n = #KEYS - 2
local floor, registry, lease = KEYS[n + 1], KEYS[n + 2], tonumber(ARGV[n + 1])
local holders = {}
for i = 1, n do
  local counter = KEYS[i] .. ':fence'
  local err = dlock_fence_check(counter, redis.call('GET', counter), floor)
  if err then
    return err
  end
  holders[i] = redis.call('GET', KEYS[i])
  if holders[i] and holders[i] ~= ARGV[i] then
    return {0, i, redis.call('PTTL', KEYS[i])}
  end
end
local clock = dlock_registry_clock(registry)
local out = {1}
for i = 1, n do
  if holders[i] then -- a retry after a lost reply: ours already
    redis.call('PEXPIRE', KEYS[i], lease)
    out[i + 1] = tonumber(redis.call('GET', KEYS[i] .. ':fence')) or 0
  else
    out[i + 1] = dlock_fence_issue(KEYS[i] .. ':fence', floor, registry, clock, lease)
    redis.call('SET', KEYS[i], ARGV[i], 'PX', lease)
  end
end
return out
