-- SPDX-License-Identifier: BSD-3-Clause
-- Read the state of a lock of any kind; with ARGV[1] = 'force', also break
-- it and wake its waiters.
-- KEYS[1] the base key, KEYS[2] its fence counter; ARGV[2] release channel
-- Returns {held, pttl, fence, kind, then for each holder: fence, ttl ms,
-- record}. fence is the counter's (the highest issued); kind is what holds
-- it: 'mutex' (a plain mutex, or one with owner ids), 'fair', 'write' or
-- 'leader' (the exclusive kinds, one hold per handle of the owner), 'read'
-- (the readers), 'sem' (the permit holders), '' when free or not told (a
-- hold of an older dlock). record is the holder record ('' for none); pttl
-- is the lock's lease left, for shared holds the longest of theirs. Only
-- one of base (exclusive), base:readers and base:sem holds a name at a time
-- (one name, one kind): they are read in that order. A plain mutex's state
-- needs only GET, PTTL and EXISTS (the minimal ACL of docs/family.md).
-- #include fence
-- #include family
local base = KEYS[1]
local force = ARGV[1] == 'force'
local fence = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local out = {0, 0, fence, ''}
local value = redis.call('GET', base)
if value then
  out[1], out[2] = 1, redis.call('PTTL', base)
  local holds = {}
  if redis.call('EXISTS', base .. ':holds') == 1 then
    holds = redis.call('HGETALL', base .. ':holds')
  end
  if #holds == 0 then
    -- A plain mutex: "TOKEN[ HOLDER]" (acquire.lua).
    local sp = string.find(value, ' ', 1, true)
    out[4] = 'mutex'
    for _, v in ipairs({fence, out[2], sp and string.sub(value, sp + 1) or ''}) do
      out[#out + 1] = v
    end
  else
    for i = 2, #holds, 2 do
      out[4] = dlock_hold_rest(holds[i])
      out[#out + 1] = dlock_hold_fence(holds[i]) or 0
      out[#out + 1] = out[2]
      out[#out + 1] = dlock_hold_record(holds[i])
    end
  end
  if force then
    redis.call('DEL', base, base .. ':holds')
    redis.call('PUBLISH', ARGV[2], 'released')
  end
  return out
end
if redis.call('EXISTS', base .. ':readers', base .. ':sem') == 0 then
  return out
end
local now = dlock_now_ms()
for _, k in ipairs({{'read', ':readers', ':reader-fences'}, {'sem', ':sem', ':sem-fences'}}) do
  local zset, hash = base .. k[2], base .. k[3]
  local live = redis.call('ZRANGEBYSCORE', zset, '(' .. now, '+inf', 'WITHSCORES')
  if #live > 0 then
    out[1], out[4] = 1, k[1]
    for i = 1, #live, 2 do
      local v = redis.call('HGET', hash, live[i]) or ''
      local left = tonumber(live[i + 1]) - now
      out[#out + 1] = dlock_hold_fence(v) or 0
      out[#out + 1] = left
      out[#out + 1] = dlock_hold_record(v)
      if left > out[2] then
        out[2] = left
      end
    end
    if force then
      redis.call('DEL', zset, hash)
      redis.call('PUBLISH', ARGV[2], 'all')
    end
    return out
  end
end
return out
