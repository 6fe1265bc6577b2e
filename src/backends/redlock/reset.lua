-- SPDX-License-Identifier: BSD-3-Clause
-- Set locks again on a node that lost them (it restarted empty) while a
-- majority of the others still holds them for the same tokens (renew.lua).
-- KEYS[i] lock i; ARGV[3i-2] its token, ARGV[3i-1] its lease in ms,
-- ARGV[3i] its owner id ('' for the plain mutex)
-- An owner's hold set again records no fence here (0): this node did not
-- hold the owner's key all along, so it does not vouch for the owner's
-- fence when the owner re-enters (docs/redlock.md, "Reentrancy").
-- Returns, for each lock: 1 set (or ours already), 0 another's.
-- #include family
local out = {}
for i = 1, #KEYS do
  local token, px, owner = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1]), ARGV[3 * i]
  local holds = KEYS[i] .. ':holds'
  local value = owner ~= '' and owner or token
  out[i] = 0
  if redis.call('SET', KEYS[i], value, 'NX', 'PX', px) then
    if owner ~= '' then
      redis.call('DEL', holds)
    end
    out[i] = 1
  elseif redis.call('GET', KEYS[i]) == value then
    out[i] = 1
  end
  if out[i] == 1 and owner ~= '' then
    redis.call('HSETNX', holds, token, 0)
    dlock_pexpire_max(holds, px)
  end
end
return out
