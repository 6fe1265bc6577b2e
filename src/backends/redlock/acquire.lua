-- SPDX-License-Identifier: BSD-3-Clause
-- Redlock round 1 on one node: take the lock for a token, and say what
-- fence this node has seen (docs/redlock.md).
-- KEYS[1] the lock, KEYS[2] the node's fence high-water mark
-- ARGV[1] token, ARGV[2] lease in ms (the node's PX: lease + drift),
-- ARGV[3] the owner id ('' for the plain mutex, whose key holds the token),
-- ARGV[4] '1' reentrant, ARGV[5] '1' when the caller waits (subscribed to the
-- release channel): a busy key then gets KEYS[1]:waiters set, so that
-- release.lua announces its release (it announces nothing when no one waits:
-- a PUBLISH costs the node as much as the rest of the release). It lives
-- twice the waiter's lease, and 20 ms more, or longer for another waiter: a
-- waiter tries again (and sets it again) at least every quarter lease, and at
-- least every 10 ms (redlock.c). ARGV[5] '2': the caller waits and so do
-- other waiters of its client, which a release wakes one at a time: the key
-- is flagged whatever the outcome, so that the release after this caller's
-- is announced even when it wins (redlock_wait.c).
-- With an owner id the key holds the owner id and KEYS[1]:holds the
-- owner's holds, handle token -> the fence recorded for it here (0 until
-- round 2 records one).
-- Returns {1, value, tenure} when the key is now ours, {0, pttl, 0} when
-- another holds it; {-1, 0, 0} when the owner holds it here and may not
-- re-enter. tenure is the highest fence recorded here for the owner's holds
-- (0: none).
-- value: when the key was free, the high-water mark is raised by one in the
-- same step as the SET (mark := mark + 1), and value is the new mark: a
-- quorum replying the same value has that fence recorded while it holds our
-- key, and round 2 is not needed (docs/redlock.md, "Acquire"). When the
-- key is ours already (a retry with the same token, or a re-entry: its
-- expiry set again), the mark is not raised and value is the mark as it is:
-- only our own scripts changed it since our key was set here, so it is at
-- least the value this node gave us then (a retry is idempotent).
-- #include family
-- Each redis.call costs a server a few us, and a server's CPU is on the
-- critical path when 5 of them share a host with their clients: the free
-- key, the common case, takes two (SET NX, INCR), and the mark is read only
-- where it is needed.
local token, px, owner = ARGV[1], ARGV[2], ARGV[3]
local value = owner ~= '' and owner or token
local function flag_waiters()
  -- Never shortened: another waiter with a longer lease tries less often.
  local waiters, life = KEYS[1] .. ':waiters', 2 * tonumber(px) + 20
  if redis.call('PTTL', waiters) < life then
    redis.call('SET', waiters, '1', 'PX', life)
  end
end
if ARGV[5] == '2' then
  flag_waiters()
end
local function bad_mark()
  return redis.error_reply('DLOCKFENCE fence high-water mark ' .. KEYS[2] ..
                           ' is not a non-negative integer')
end
if redis.call('SET', KEYS[1], value, 'NX', 'PX', px) then
  local hw = redis.pcall('INCR', KEYS[2])
  if type(hw) ~= 'number' or hw < 1 then
    -- No lock without a fence: give the key back (it was free), and a
    -- negative mark the INCR moved back to what it was.
    redis.call('DEL', KEYS[1])
    if type(hw) == 'number' then
      redis.call('DECR', KEYS[2])
    end
    return bad_mark()
  end
  if owner ~= '' then
    local holds = KEYS[1] .. ':holds'
    redis.call('DEL', holds) -- what a forced release left
    redis.call('HSET', holds, token, 0)
    redis.call('PEXPIRE', holds, px)
  end
  return {1, hw, 0}
end
if redis.call('GET', KEYS[1]) ~= value then
  if ARGV[5] == '1' then
    flag_waiters()
  end
  return {0, redis.call('PTTL', KEYS[1]), 0}
end
local hw = redis.call('GET', KEYS[2])
if hw and not string.match(hw, '^%d+$') then
  return bad_mark()
end
hw = tonumber(hw or '0')
if owner == '' then
  redis.call('PEXPIRE', KEYS[1], px)
  return {1, hw, 0}
end
local holds = KEYS[1] .. ':holds'
local mine = redis.call('HEXISTS', holds, token) == 1
if not mine and ARGV[4] ~= '1' and redis.call('HLEN', holds) > 0 then
  return {-1, 0, 0}
end
local tenure = 0
for _, f in ipairs(redis.call('HVALS', holds)) do
  tenure = math.max(tenure, tonumber(f) or 0)
end
if not mine then
  redis.call('HSET', holds, token, 0)
end
-- The holds share the key's lease: never shorten it for the others.
dlock_pexpire_max(KEYS[1], tonumber(px))
dlock_pexpire_max(holds, tonumber(px))
return {1, hw, tenure}
