-- SPDX-License-Identifier: BSD-3-Clause
-- Renew (or only check) a batch of locks on one node.
-- KEYS[i] lock i; ARGV[3i-2] its token, ARGV[3i-1] its lease in ms (the
-- node's PX), or 0 to check without renewing, ARGV[3i] its owner id ('' for
-- the plain mutex; with one, the key holds it and KEYS[i]:holds the token)
-- Returns, for each lock: 1 ours (renewed), 0 absent (for an owner: also
-- the owner's key without this handle's hold), -1 another's.
-- #include family
local out = {}
for i = 1, #KEYS do
  local token, px, owner = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1]), ARGV[3 * i]
  local holds = KEYS[i] .. ':holds'
  local v = redis.call('GET', KEYS[i])
  if owner == '' and v == token then
    if px > 0 then
      redis.call('PEXPIRE', KEYS[i], px)
    end
    out[i] = 1
  elseif owner ~= '' and v == owner then
    out[i] = redis.call('HEXISTS', holds, token)
    if out[i] == 1 and px > 0 then
      -- A reentrant owner's holds share the lease: never shorten it for the
      -- others.
      local alone = redis.call('HLEN', holds) == 1
      for _, k in ipairs({KEYS[i], holds}) do
        if alone then
          redis.call('PEXPIRE', k, px)
        else
          dlock_pexpire_max(k, px)
        end
      end
    end
  elseif v then
    out[i] = -1
  else
    out[i] = 0
  end
end
return out
