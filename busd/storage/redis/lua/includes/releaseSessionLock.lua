--- @include "unlockSession"
-- Release session `sid`'s lock for `holder` ('' an operator: whoever holds it), as its
-- receiver's close does (includes/unlockSession.lua); `expire`: as if the lock had expired.
-- 1 released, 0 not held (by this holder): nothing changed.
local function releaseSessionLock(Q, holder, sid, expire)
  local current = redis.call('HGET', Q.sholder, sid)
  if not current or (holder ~= '' and current ~= holder) then return 0 end
  local caller = Q.caller
  Q.caller = current -- its wake-ups go to others
  -- whether its lock had expired is read only when it has messages to return
  -- (includes/unlockSession.lua)
  unlockSession(Q, sid, expire or nil)
  Q.caller = caller
  return 1
end
