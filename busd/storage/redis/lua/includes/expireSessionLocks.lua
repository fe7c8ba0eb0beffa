--- @include "unlockSession"
--- @include "countEvent"
-- Session locks that ran out (at most `limit`). Returns their session ids.
local function expireSessionLocks(Q, limit)
  local sids = redis.call('ZRANGEBYSCORE', Q.slocks, '-inf', Q.now, 'LIMIT', 0, limit)
  for _, sid in ipairs(sids) do unlockSession(Q, sid, true) end
  countEvent(Q, Q.q, 'sessionlockexpired', #sids)
  return sids
end
