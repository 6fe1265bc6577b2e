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

-- Make token the holder of base: set base to value for px ms, and make
-- token the only holder in holds, with its fence, holder record and kind
-- word (dlock_hold_value).
local function dlock_hold_set(base, holds, value, token, fence, holder, kind, px)
  redis.call('SET', base, value, 'PX', px)
  redis.call('DEL', holds)
  redis.call('HSET', holds, token, dlock_hold_value(fence, holder, kind))
  redis.call('PEXPIRE', holds, px)
end

-- Make token a holder of a shared lock (a reader in zset base:readers, a
-- permit in base:sem) for px ms: a member of zset scored with its expiry,
-- its fence, holder record and rest (dlock_hold_value) in hash.
local function dlock_zhold_set(zset, hash, token, fence, holder, rest, now, px)
  redis.call('ZADD', zset, now + px, token)
  redis.call('HSET', hash, token, dlock_hold_value(fence, holder, rest))
  dlock_pexpire_max(zset, px)
  dlock_pexpire_max(hash, px)
end

-- Take the lock base for token (a writer, a reentrant owner, a leader):
-- issue the next fence of counter (whose GET was count) and hold it for the
-- lease (dlock_hold_set). Needs fence.lua.
-- Returns the fence, or nil and an error reply (before any write).
local function dlock_take(base, holds, value, token, lease, counter, count, floor, registry,
                          holder, kind)
  local fence, err = dlock_fence_next(counter, count, floor, registry, lease)
  if not fence then
    return nil, err
  end
  dlock_hold_set(base, holds, value, token, fence, holder, kind, lease)
  return fence
end

-- ---- Grants pushed to a waiter that listens (redis_listen.c) ----
-- A waiter that listens for its grant keeps a BLPOP of its own list,
-- base:grant:WAITER-ID, and its tries leave an entry saying what a release
-- needs to hand it the lock: "KIND TOKEN LEASE RECORD-LENGTH RECORD..OWNER"
-- (KIND 'f' fair, 'r' reader, 'w' writer, 's' permit; OWNER the owner value
-- of a fair waiter or a writer, the owner id of a reader, '' for a permit;
-- last, as an owner id may hold any byte). The fair lock keeps these entries
-- in base:queue-grant beside its queue; the read-write lock and the
-- semaphore, whose other waiters are not queued, in base:listen (waiter id
-- -> arrival), base:listen-exp (-> expiry, server ms) and base:listen-grant.

local function dlock_grant_entry(kind, token, lease, record, owner)
  return kind .. ' ' .. token .. ' ' .. lease .. ' ' .. #record .. ' ' .. record .. owner
end

-- The fields of an entry: kind, token, lease (a number), record, owner; nil
-- for one that does not parse.
local function dlock_grant_parse(entry)
  local kind, token, lease, rlen, rest = string.match(entry, '^(%a) (%x+) (%d+) (%d+) (.*)$')
  if not kind then
    return nil
  end
  rlen = tonumber(rlen)
  return kind, token, tonumber(lease), string.sub(rest, 1, rlen), string.sub(rest, rlen + 1)
end

-- The next fence of base's counter for a hold handed over by a release
-- (floor and registry: the script's fence keys), or nil when none can be
-- issued (a counter that is not an integer, a broken floor): the release
-- then leaves the waiter to try, which reports why.
local function dlock_grant_fence(base, floor, registry, lease)
  local counter = base .. ':fence'
  local count = redis.call('GET', counter)
  if dlock_fence_check(counter, count) then
    return nil
  end
  return (dlock_fence_next(counter, count, floor, registry, lease))
end

-- What a release hands over to the waiter whose grant entry is entry, when
-- it is of kind: the waiter's token, the next fence, how long the hold
-- lives (min(its lease, window) ms), its holder record and its owner; nil
-- when the entry is not of kind or no fence can be issued.
local function dlock_grant_begin(base, entry, kind, floor, registry, window)
  local k, t, lease, record, owner = dlock_grant_parse(entry)
  if k ~= kind then
    return nil
  end
  local fence = dlock_grant_fence(base, floor, registry, lease)
  if not fence then
    return nil
  end
  return t, fence, math.min(lease, window), record, owner
end

-- Hand the exclusive lock base over to the waiter whose grant entry is
-- entry, of kind ('f' a fair waiter, 'w' a writer; word: the kind word its
-- hold keeps), for min(its lease, window) ms with the next fence (floor and
-- registry: the script's fence keys). Returns the fence and that time, or
-- nil when the entry is not of kind or no fence can be issued.
local function dlock_grant_hold(base, entry, kind, word, floor, registry, window)
  local t, fence, px, record, value = dlock_grant_begin(base, entry, kind, floor, registry,
                                                        window)
  if not t then
    return nil
  end
  dlock_hold_set(base, base .. ':holds', value, t, fence, record, word, px)
  return fence, px
end

-- A hold kept as a member of zset (a reader, a permit) scored with its
-- expiry, which hash keeps the fence of, found by its own try: a retry
-- after a lost reply, or a hold a release handed over for the confirm
-- window only. It is ours for the whole lease from this try.
local function dlock_zhold_keep(zset, hash, token, now, lease)
  if tonumber(redis.call('ZSCORE', zset, token)) < now + lease then
    redis.call('ZADD', zset, 'XX', now + lease, token)
  end
  dlock_pexpire_max(zset, lease)
  dlock_pexpire_max(hash, lease)
end

-- Push fence to waiter wid's list, which lives px. False when refused (an
-- ACL without RPUSH): the waiter then finds its hold at its next try.
local function dlock_grant_push(base, wid, fence, px)
  local list = base .. ':grant:' .. wid
  if pcall(redis.call, 'RPUSH', list, fence) then
    redis.call('PEXPIRE', list, px)
    return true
  end
  return false
end

-- Waiter wid takes a place at the end of order (ZSET -> arrival number), or
-- keeps its place: its expiry in exp moves ttl past now. Its grant entry
-- goes to grants, or, nil, out of it (a waiter that does not listen, or no
-- longer). The fair queue's places (excl_acquire) and the registrations of
-- the read-write lock's and the semaphore's waiters that listen.
local function dlock_place_keep(order, exp, grants, wid, entry, ttl, now)
  if not redis.call('ZSCORE', order, wid) then
    local last = redis.call('ZRANGE', order, -1, -1, 'WITHSCORES')
    redis.call('ZADD', order, last[2] and tonumber(last[2]) + 1 or 1, wid)
  end
  redis.call('ZADD', exp, now + ttl, wid)
  dlock_pexpire_max(order, ttl)
  dlock_pexpire_max(exp, ttl)
  if entry then
    redis.call('HSET', grants, wid, entry)
    dlock_pexpire_max(grants, ttl)
  else
    redis.call('HDEL', grants, wid)
  end
end

-- Register (or refresh) waiter wid that listens, with entry, for ttl ms.
local function dlock_listen_add(base, wid, entry, ttl, now)
  dlock_place_keep(base .. ':listen', base .. ':listen-exp', base .. ':listen-grant', wid, entry,
                   ttl, now)
end

local function dlock_listen_drop(base, wid)
  redis.call('ZREM', base .. ':listen', wid)
  redis.call('ZREM', base .. ':listen-exp', wid)
  redis.call('HDEL', base .. ':listen-grant', wid)
end

-- The first limit waiters that listen (-1: all), in arrival order, each
-- {wid, entry}, after dropping those whose registration expired.
local function dlock_listeners(base, now, limit)
  local order, exp, grants = base .. ':listen', base .. ':listen-exp', base .. ':listen-grant'
  dlock_prune(exp, now, order, grants)
  local out = {}
  for _, wid in ipairs(redis.call('ZRANGE', order, 0, limit < 0 and -1 or limit - 1)) do
    local e = redis.call('HGET', grants, wid)
    if e then
      out[#out + 1] = {wid, e}
    end
  end
  return out
end

-- Hand a shared hold (a read lock in zset readers, a permit in sem) to the
-- waiter wid whose grant entry is entry, of kind ('r' or 's'), with the
-- next fence, for min(its lease, window) ms: a member of zset scored with
-- its expiry, its fence in hash; its registration dropped and the fence
-- pushed to its list. Returns whether the push was made (false: not handed,
-- as the entry is not of kind or no fence can be issued, or handed and
-- the push refused: the waiter finds its hold at its next try).
local function dlock_grant_zhold(base, wid, entry, kind, zset, hash, floor, registry, window,
                                 now)
  local t, fence, px, record, owner = dlock_grant_begin(base, entry, kind, floor, registry,
                                                        window)
  if not t then
    return false
  end
  dlock_zhold_set(zset, hash, t, fence, record, owner, now, px)
  dlock_listen_drop(base, wid)
  return dlock_grant_push(base, wid, fence, px)
end
