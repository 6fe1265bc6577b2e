-- SPDX-License-Identifier: BSD-3-Clause
-- Take an exclusive lock of the family: a mutex with an owner id (reentrant
-- or not), a fair lock, or leadership of an election.
-- KEYS[1] the base key, KEYS[2] the fence floor, KEYS[3] the fence registry
-- ARGV[1] kind: 'mutex', 'fair' or 'leader'
-- ARGV[2] this handle's token, ARGV[3] the owner value stored in the lock
--   (the owner id, or the token), ARGV[4] '1' reentrant
-- ARGV[5] lease ms, ARGV[6] 'wait' (queue if busy) or 'try' (leave nothing)
-- ARGV[7] a fair waiter's place expiry in ms (server time)
-- ARGV[8] leader identity, ARGV[9] the leader channel, ARGV[10] a fair
-- waiter's id ('' for a try): random, apart from the token, because the
-- release names it on the channel, which the token never travels on;
-- ARGV[11] the holder record ('' for none), ARGV[12] '1' for a fair waiter
-- that listens for its grant (redis_listen.c; excl_release hands it the lock
-- and pushes the fence to PREFIX{NAME}:grant:WAITER-ID), else ''
-- Keys: base = the owner value (PX lease), base:holds = token -> "FENCE
-- HOLDER\nKIND" of each handle holding it (lib/family.lua, dlock_hold_value); fair: base:queue = waiter id -> arrival order,
-- base:queue-exp = waiter id -> expiry, base:queue-grant = waiter id ->
-- the grant entry of each waiter that listens (lib/family.lua: what
-- excl_release needs to hand the lock over); leader: base:leader =
-- identity.
-- Returns {1, fence}, {0, retry ms} when busy, {-1, 1} when the owner holds
-- it and may not re-enter, {-1, 2} when it is held by a lock without holds.
-- #include fence
-- #include family
local base, kind, token, value = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local lease, waiting, ttl = tonumber(ARGV[5]), ARGV[6] == 'wait', tonumber(ARGV[7])
local wid, record = ARGV[10], ARGV[11]
local holds, counter = base .. ':holds', base .. ':fence'
local queue, qexp, grants = base .. ':queue', base .. ':queue-exp', base .. ':queue-grant'

local count = redis.call('GET', counter)
local err = dlock_fence_check(counter, count)
if err then
  return err
end

local holder = redis.call('GET', base)
if holder and holder == value then
  local mine = redis.call('HGET', holds, token)
  if not mine then
    if ARGV[4] ~= '1' then
      return {-1, 1}
    end
    -- Re-entry: one more hold of the owner, with the same fence.
    mine = redis.call('HVALS', holds)[1]
    if not mine then
      return {-1, 2}
    end
    mine = dlock_hold_fence(mine)
    redis.call('HSET', holds, token, dlock_hold_value(mine, record, kind))
  else
    mine = dlock_hold_fence(mine)
  end
  -- (Without re-entry: a retry after a lost reply.)
  dlock_pexpire_max(base, lease)
  dlock_pexpire_max(holds, lease)
  if kind == 'leader' then
    dlock_pexpire_max(base .. ':leader', lease)
  end
  return {1, mine}
end

local now = nil
-- A fair waiter takes a place at the end of the queue, or keeps its place
-- alive: its expiry moves ttl past now.
-- Its grant entry goes with it while it listens (ARGV[12]).
local function enqueue()
  dlock_place_keep(queue, qexp, grants, wid, ARGV[12] == '1' and
                   dlock_grant_entry('f', token, ARGV[5], record, value) or nil, ttl, now)
end

if kind == 'fair' then
  now = dlock_now_ms()
  dlock_prune(qexp, now, queue, grants)
end
if holder then
  local retry = redis.call('PTTL', base)
  if kind == 'fair' and waiting then
    enqueue()
    if retry < 0 or retry > dlock_refresh_ms(ttl) then
      retry = dlock_refresh_ms(ttl)
    end
  end
  return {0, retry}
end
if kind == 'fair' then
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if head and head ~= wid then
    -- Free, but someone came first: it was woken and is on its way (or it
    -- died, and leaves the queue when its expiry passes).
    local left = math.max(0, tonumber(redis.call('ZSCORE', qexp, head) or now) - now)
    if waiting then
      enqueue()
      left = math.min(left, dlock_refresh_ms(ttl))
    end
    return {0, left}
  end
  if head then
    redis.call('ZREM', queue, wid)
    redis.call('ZREM', qexp, wid)
  end
  if wid ~= '' then
    redis.call('HDEL', grants, wid)
  end
end

local fence
fence, err = dlock_take(base, holds, value, token, lease, counter, count, KEYS[2], KEYS[3],
                        record, kind)
if not fence then
  return err
end
if kind == 'leader' then
  redis.call('SET', base .. ':leader', ARGV[8], 'PX', lease)
  redis.call('PUBLISH', ARGV[9], 'all')
end
return {1, fence}
