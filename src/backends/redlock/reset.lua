-- Set locks again on a node that lost them (it restarted empty) while a
-- majority of the others still holds them for the same tokens (renew.lua).
-- KEYS[i] lock i; ARGV[2i-1] its token, ARGV[2i] its lease in ms
-- Returns, for each lock: 1 set (or ours already), 0 another's.
local out = {}
for i = 1, #KEYS do
  if redis.call('SET', KEYS[i], ARGV[2 * i - 1], 'NX', 'PX', ARGV[2 * i]) or
     redis.call('GET', KEYS[i]) == ARGV[2 * i - 1] then
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
