--- @include "sessionRange"
-- A session that has just lost its holder or its last message: when it has neither and lives
-- on for its state, it is idle from now (`sidle`, expired by includes/expireIdleSessions.lua).
-- Scripts without the key (the session state scripts: the caller holds the session, so it is
-- not idle) skip it.
local function noteIdleSession(Q, sid)
  if not Q.sidle or redis.call('HEXISTS', Q.sholder, sid) == 1
      or redis.call('HEXISTS', Q.sstate, sid) == 0 then
    return
  end
  local lo, hi = sessionRange(sid)
  if redis.call('ZLEXCOUNT', Q.q.sall, lo, hi) == 0 then
    redis.call('ZADD', Q.sidle, Q.now, sid)
  end
end
