-- SPDX-License-Identifier: BSD-3-Clause
-- Helpers of the lock family's scripts (docs/family.md). Each script gets the
-- name's base key PREFIX{NAME} as KEYS[1] and derives its other keys from it
-- by a suffix, so that all of them share its hash tag.

-- PEXPIRE key to ms from now unless it already lives longer (a shared key
-- must outlive the longest lease of the members it holds).
local function dlock_pexpire_max(key, ms)
  local left = redis.call('PTTL', key)
  if left ~= -2 and left < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- Drop the members of zset (member -> server-time expiry) whose expiry has
-- passed, and the same members of other_zset and hash when given.
local function dlock_prune(zset, now, other_zset, hash)
  local dead = redis.call('ZRANGEBYSCORE', zset, '-inf', now)
  for _, m in ipairs(dead) do
    redis.call('ZREM', zset, m)
    if other_zset then
      redis.call('ZREM', other_zset, m)
    end
    if hash then
      redis.call('HDEL', hash, m)
    end
  end
end

-- A fair waiter's retries refresh its place this often (its expiry is ttl).
local function dlock_refresh_ms(ttl)
  return math.max(1, math.floor(ttl / 3))
end

-- A hold's value in the hashes that keep each holder's fence (base:holds,
-- base:reader-fences, base:sem-fences): "FENCE HOLDER\nREST", HOLDER the
-- holder record ("HOST PID START_MS[ LABEL]", '' when none; printable, so
-- never a newline) and REST what the kind keeps beside it (the hold's kind
-- word in base:holds, a reader's owner id). Keeping the record in the value
-- the acquisition writes anyway costs no command; it goes with the hold.
local function dlock_hold_value(fence, holder, rest)
  return fence .. ' ' .. holder .. '\n' .. rest
end

-- The fence of a hold's value (also of an older dlock's "FENCE[ OWNER]").
local function dlock_hold_fence(v)
  return tonumber(string.match(v, '^%d+'))
end

-- The holder record of a hold's value ('' for none, or an older dlock's).
local function dlock_hold_record(v)
  return string.match(v, '^%d+ ([^\n]*)\n') or ''
end

-- The REST of a hold's value; an older dlock's "FENCE OWNER" is all REST.
local function dlock_hold_rest(v)
  local nl = string.find(v, '\n', 1, true)
  if nl then
    return string.sub(v, nl + 1)
  end
  local sp = string.find(v, ' ', 1, true)
  return sp and string.sub(v, sp + 1) or ''
end

-- Take the lock base for token (a writer, a reentrant owner, a leader):
-- issue the next fence of counter (whose GET was count), set base to value
-- with the lease, and make token the only holder in holds, with its holder
-- record and kind word (dlock_hold_value). Needs fence.lua. px, when given,
-- is how long the keys live instead of the lease (a fair lock handed over:
-- excl_release.lua).
-- Returns the fence, or nil and an error reply (before any write).
local function dlock_take(base, holds, value, token, lease, counter, count, floor, registry,
                          holder, kind, px)
  local fence, err = dlock_fence_next(counter, count, floor, registry, lease)
  if not fence then
    return nil, err
  end
  px = px or lease
  redis.call('SET', base, value, 'PX', px)
  redis.call('DEL', holds)
  redis.call('HSET', holds, token, dlock_hold_value(fence, holder, kind))
  redis.call('PEXPIRE', holds, px)
  return fence
end
