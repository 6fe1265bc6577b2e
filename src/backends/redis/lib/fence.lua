-- Fences with bounded state (docs/family.md, "Bounded state").
--
-- Each lock name has a counter, PREFIX{NAME}:fence, INCR'd for every token.
-- So that the counters of names nobody uses any more do not pile up, a
-- registry (the ZSET PREFIX fence-registry) scores each counter with the
-- server time after which it may be retired, and retiring a counter first
-- raises PREFIX fence-floor to its value, then deletes it. A missing counter
-- is recreated at the floor, so the next token of a retired name is above
-- every token it had before. Retiring is always safe; time only says when.
-- The registry needs TIME and the ZSET commands: a user whose ACL lacks them
-- keeps its counters for ever (the floor is still honoured).

-- Unused counters are retired after this long (ms), or 10 leases if longer.
local DLOCK_RETENTION_MS = 86400000

-- Server time in ms.
local function dlock_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The server time when this user may keep the registry, else nil.
local function dlock_registry_clock(registry)
  if redis.acl_check_cmd('TIME') and redis.acl_check_cmd('ZADD', registry, '0', 'x') and
     redis.acl_check_cmd('ZSCORE', registry, 'x') and
     redis.acl_check_cmd('ZRANGEBYSCORE', registry, '0', '0') and
     redis.acl_check_cmd('ZREM', registry, 'x') and redis.acl_check_cmd('DEL', registry) then
    return dlock_now_ms()
  end
  return nil
end

-- An error reply if the counter or the floor holds something else than an
-- integer, checked before anything is written.
local function dlock_fence_check(counter, value, floor_key)
  if value and not tonumber(value) then
    return redis.error_reply('DLOCKFENCE fence counter ' .. counter .. ' is not an integer')
  end
  local floor = redis.call('GET', floor_key)
  if floor and not tonumber(floor) then
    return redis.error_reply('DLOCKFENCE fence floor ' .. floor_key .. ' is not an integer')
  end
  return nil
end

-- Issue the next token of counter. now_ms: from dlock_registry_clock, or nil.
-- The counter is read again here: retiring others (a multi-lock issues
-- several tokens in one script) may have retired it since the check.
local function dlock_fence_issue(counter, floor_key, registry, now_ms, lease_ms)
  if not redis.call('GET', counter) then
    local floor = tonumber(redis.call('GET', floor_key) or '0')
    if floor > 0 then
      redis.call('SET', counter, floor)
    end
  end
  local fence = redis.call('INCR', counter)
  if now_ms then
    local keep = math.max(DLOCK_RETENTION_MS, 10 * lease_ms)
    local due = redis.call('ZSCORE', registry, counter)
    -- Rewrite the entry only when half its time is gone: one write per
    -- name per half retention, not one per acquisition.
    if not due or tonumber(due) - now_ms < keep / 2 then
      redis.call('ZADD', registry, now_ms + keep, counter)
    end
    local old = redis.call('ZRANGEBYSCORE', registry, '-inf', now_ms, 'LIMIT', 0, 2)
    for _, k in ipairs(old) do
      local last = redis.pcall('GET', k)
      last = type(last) == 'string' and tonumber(last) or nil
      if last then
        local floor = tonumber(redis.call('GET', floor_key) or '0')
        if last > floor then
          redis.call('SET', floor_key, last)
        end
        redis.call('DEL', k)
      end
      redis.call('ZREM', registry, k)
    end
  end
  return fence
end
