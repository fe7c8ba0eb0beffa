--- @include "unlistedSession"
-- How many sessions of sorted set `index` are left out of listings (includes/unlistedSession.lua):
-- only held sessions can be, so the holders are looked at, one by one (O(held sessions); for
-- the counts and the inspector's totals, never on a message's path).
local function unlistedCount(Q, index)
  local n = 0
  for _, sid in ipairs(redis.call('HKEYS', Q.sholder)) do
    if redis.call('ZSCORE', index, sid) and unlistedSession(Q, sid, true) then n = n + 1 end
  end
  return n
end
