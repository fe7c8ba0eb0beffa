--- @include "sessionHasMessages"
-- A session that has just lost its holder or its last message: when it has neither and lives
-- on for its state, it is idle from now (`sidle`, expired by includes/expireIdleSessions.lua).
-- `known` names what the caller has just checked, so it is not read again: `unheld` (no
-- holder), `stateful` (it has state), `empty` (no messages). Scripts without the key (the
-- session state scripts: the caller holds the session, so it is not idle) skip it.
local function noteIdleSession(Q, sid, known)
  if not Q.sidle then return end
  if not known.unheld and redis.call('HEXISTS', Q.sholder, sid) == 1 then return end
  if not known.stateful and redis.call('HEXISTS', Q.sstate, sid) == 0 then return end
  if not known.empty and sessionHasMessages(Q, sid) then return end
  redis.call('ZADD', Q.sidle, Q.now, sid)
end
