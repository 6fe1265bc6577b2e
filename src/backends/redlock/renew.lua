-- Renew (or only check) a batch of locks on one node.
-- KEYS[i] lock i; ARGV[2i-1] its token, ARGV[2i] its lease in ms (the
-- node's PX), or 0 to check without renewing
-- Returns, for each lock: 1 ours (renewed), 0 absent, -1 another's.
local out = {}
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v == ARGV[2 * i - 1] then
    if tonumber(ARGV[2 * i]) > 0 then
      redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    end
    out[i] = 1
  elseif v then
    out[i] = -1
  else
    out[i] = 0
  end
end
return out
