-- The watchdog's batch: compare-and-pexpire many locks in one round trip.
-- KEYS[1..n] the locks; ARGV[1..n] their owner tokens, ARGV[n+1..2n] their leases in ms
-- Returns an array of n results: 1 renewed, 0 no longer ours.
local n = #KEYS
local out = {}
for i = 1, n do
  if redis.call('GET', KEYS[i]) == ARGV[i] then
    redis.call('PEXPIRE', KEYS[i], ARGV[n + i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
