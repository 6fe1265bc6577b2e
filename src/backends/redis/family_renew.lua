-- SPDX-License-Identifier: BSD-3-Clause
-- Renew (or only check) many locks of any kind in one round trip: the
-- watchdog's batch when it holds locks of the family, and extend / check.
-- KEYS[1..n] the base keys
-- ARGV[1] 'renew' or 'check'; then for lock i, ARGV[4i-2 .. 4i+1]: kind
-- ('mutex' plain, 'excl' for mutex with owner, fair and write, 'leader',
-- 'read', 'sem'), token, owner value ('' for 'mutex', 'read' and 'sem',
-- which do not read it), lease ms
-- Returns a string of n results, one character a lock: '1' ours (renewed),
-- '0' no longer ours (one reply object for the client to read, not n + 1).
-- #include fence
-- #include family
local renew = ARGV[1] == 'renew'
local now = nil
local out = {}
for i = 1, #KEYS do
  local base, kind, token, value = KEYS[i], ARGV[4 * i - 2], ARGV[4 * i - 1], ARGV[4 * i]
  local lease = tonumber(ARGV[4 * i + 1])
  local ok = '0'
  if kind == 'mutex' then
    -- "TOKEN[ HOLDER]" (acquire.lua): the record lives and dies with it.
    local held = redis.call('GET', base)
    if held and (held == token or string.sub(held, 1, #token + 1) == token .. ' ') then
      ok = '1'
      if renew then
        redis.call('PEXPIRE', base, lease)
      end
    end
  elseif kind == 'read' or kind == 'sem' then
    local zset = base .. (kind == 'read' and ':readers' or ':sem')
    local hash = base .. (kind == 'read' and ':reader-fences' or ':sem-fences')
    now = now or dlock_now_ms()
    local score = redis.call('ZSCORE', zset, token)
    if score and tonumber(score) > now then
      ok = '1'
      if renew then
        redis.call('ZADD', zset, 'XX', now + lease, token)
        dlock_pexpire_max(zset, lease)
        dlock_pexpire_max(hash, lease)
      end
    elseif score and renew then -- its lease ended; not pruned yet
      redis.call('ZREM', zset, token)
      redis.call('HDEL', hash, token)
    end
  else
    local holds = base .. ':holds'
    if redis.call('GET', base) == value and redis.call('HEXISTS', holds, token) == 1 then
      ok = '1'
      if renew then
        local keys = {base, holds}
        if kind == 'leader' then
          keys[3] = base .. ':leader'
        end
        -- A reentrant owner's holds share the lease: never shorten it for
        -- the others.
        local alone = redis.call('HLEN', holds) == 1
        for _, k in ipairs(keys) do
          if alone then
            redis.call('PEXPIRE', k, lease)
          else
            dlock_pexpire_max(k, lease)
          end
        end
      end
    end
  end
  out[i] = ok
end
return table.concat(out)
