-- SPDX-License-Identifier: BSD-3-Clause
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

-- The highest fence issued: 2^53 - 1. Lua numbers are doubles, so a larger
-- one would reach the client rounded, and two tokens could come out equal.
-- (At a million tokens a second, a name takes 285 years to get there; only
-- a counter or floor SET by hand can.)
local DLOCK_FENCE_MAX = 9007199254740991

-- Is a greater than b? a is a counter's value that Redis wrote (INCR: no
-- sign, no leading zero, so a longer one is larger); b is the floor's GET,
-- taken as 0 unless it is such a positive integer. Compared as text: a
-- counter SET by hand beyond 2^53 would not survive a trip through a Lua
-- number.
local function dlock_int_gt(a, b)
  if not (b and string.match(b, '^[1-9]%d*$')) then
    return true
  end
  if #a ~= #b then
    return #a > #b
  end
  return a > b
end

-- The error reply for a counter that would issue a fence above
-- DLOCK_FENCE_MAX.
local function dlock_fence_too_high(counter)
  return redis.error_reply('DLOCKFENCE fence counter ' .. counter .. ' would pass ' ..
                           string.format('%d', DLOCK_FENCE_MAX) .. ' (2^53 - 1), the ' ..
                           'highest fence the scripts hold exactly')
end

-- Server time in ms.
local function dlock_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The server time when this user may keep the registry (its ACL allows
-- TIME and ZADD: grant the ZSET commands of docs/family.md with them), else
-- nil.
local function dlock_registry_clock(registry)
  if redis.acl_check_cmd('TIME') and redis.acl_check_cmd('ZADD', registry, '0', 'x') then
    return dlock_now_ms()
  end
  return nil
end

-- An error reply if the counter holds something else than an integer, to
-- be checked before anything is written. value: the counter's GET.
local function dlock_fence_check(counter, value)
  if value and not tonumber(value) then
    return redis.error_reply('DLOCKFENCE fence counter ' .. counter .. ' is not an integer')
  end
  return nil
end

-- Issue the next token of counter, whose value (GET, false when missing)
-- the caller read in this script. A missing counter starts at the floor.
-- Returns the token, or nil and an error reply (before any write) when the
-- floor is broken.
local function dlock_fence_issue(counter, value, floor_key)
  local start = value
  if not value then
    start = redis.call('GET', floor_key)
    if start and not tonumber(start) then
      return nil, redis.error_reply('DLOCKFENCE fence floor ' .. floor_key ..
                                    ' is not an integer')
    end
  end
  if start and tonumber(start) >= DLOCK_FENCE_MAX then
    return nil, dlock_fence_too_high(counter)
  end
  if not value and start then
    redis.call('SET', counter, start)
  end
  return redis.call('INCR', counter)
end

-- Note in the registry that counter was used at now_ms (from
-- dlock_registry_clock; nil: nothing to do).
local function dlock_fence_note(counter, registry, now_ms, lease_ms)
  if now_ms then
    local keep = math.max(DLOCK_RETENTION_MS, 10 * lease_ms)
    local due = redis.call('ZSCORE', registry, counter)
    -- Rewrite the entry only when half its time is gone: one write per
    -- name per half retention, not one per acquisition.
    if not due or tonumber(due) - now_ms < keep / 2 then
      redis.call('ZADD', registry, now_ms + keep, counter)
    end
  end
end

-- Retire up to two counters whose time has come: raise the floor to each
-- one's value, then delete it. Run after the script's tokens are issued.
-- The floor is only ever raised, never lowered. Only this prefix's counters
-- (PREFIX{NAME}:fence, PREFIX being the floor's key less 'fence-floor') are
-- touched: an entry naming any other key is dropped from the registry.
local function dlock_fence_retire(floor_key, registry, now_ms)
  if not now_ms then
    return
  end
  -- A cluster's floor is PREFIX{fence:N}fence-floor, one per hash slot
  -- (redis_int.h): its counters are PREFIX{NAME}:fence all the same.
  local mine = string.sub(floor_key, 1, #floor_key - #'fence-floor')
  mine = string.gsub(mine, '{fence:%d+}$', '') .. '{'
  local old = redis.call('ZRANGEBYSCORE', registry, '-inf', now_ms, 'LIMIT', 0, 2)
  for _, k in ipairs(old) do
    if string.sub(k, 1, #mine) == mine and string.sub(k, -7) == '}:fence' then
      local last = redis.pcall('GET', k)
      if type(last) == 'string' and string.match(last, '^%-?%d+$') then
        if string.match(last, '^[1-9]%d*$') and
           dlock_int_gt(last, redis.call('GET', floor_key)) then
          redis.call('SET', floor_key, last)
        end
        redis.call('DEL', k)
      end
    end
    redis.call('ZREM', registry, k)
  end
end

-- Is this token one that keeps the registry? A counter's first token must
-- (it registers the name); then one token in DLOCK_UPKEEP_EVERY does, so
-- the common acquisition pays nothing for it. A name used that rarely may
-- be retired while still in use: safe, its next token just starts at the
-- floor. Each upkeep retires up to two counters, and every registration
-- comes with an upkeep, so the registry drains faster than it can grow.
local DLOCK_UPKEEP_EVERY = 16
local function dlock_fence_upkeep(value, fence)
  return not value or fence % DLOCK_UPKEEP_EVERY == 0
end

-- The usual sequence for one token: issue, then keep the registry when due.
-- Returns the token, or nil and an error reply.
local function dlock_fence_next(counter, value, floor_key, registry, lease_ms)
  local fence, err = dlock_fence_issue(counter, value, floor_key)
  if not fence then
    return nil, err
  end
  if dlock_fence_upkeep(value, fence) then
    local now = dlock_registry_clock(registry)
    dlock_fence_note(counter, registry, now, lease_ms)
    dlock_fence_retire(floor_key, registry, now)
  end
  return fence
end

-- The same for a script that has already done INCR counter (the plain
-- acquire, whose common case needs none of this file): incr is what INCR
-- returned. A counter INCR just created (1) starts at the floor instead,
-- and keeps the registry, as does one token in DLOCK_UPKEEP_EVERY. Returns
-- the token, or nil and an error reply; the caller then undoes the INCR.
local function dlock_fence_after_incr(counter, incr, floor_key, registry, lease_ms)
  local fence = incr
  if incr == 1 then
    local floor = redis.call('GET', floor_key)
    if floor then
      local n = tonumber(floor)
      if not n or n ~= math.floor(n) then
        return nil, redis.error_reply('DLOCKFENCE fence floor ' .. floor_key ..
                                      ' is not an integer')
      end
      if n >= DLOCK_FENCE_MAX then
        return nil, dlock_fence_too_high(counter)
      end
      if n >= 1 then
        -- The server counts, not Lua: the floor's exact value plus one.
        redis.call('SET', counter, floor)
        fence = redis.call('INCR', counter)
      end
    end
  end
  if incr == 1 or fence % DLOCK_UPKEEP_EVERY == 0 then
    local now = dlock_registry_clock(registry)
    dlock_fence_note(counter, registry, now, lease_ms)
    dlock_fence_retire(floor_key, registry, now)
  end
  return fence
end
