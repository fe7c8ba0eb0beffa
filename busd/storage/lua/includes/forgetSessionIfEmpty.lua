--- @include "sessionRange"
--- @include "noteIdleSession"
-- A session exists while it has messages or state; one left with only its state and no
-- holder is idle from now. True when the session was forgotten (it had neither).
local function forgetSessionIfEmpty(Q, sid)
  local lo, hi = sessionRange(sid)
  if redis.call('ZLEXCOUNT', Q.q.sall, lo, hi) ~= 0 then return false end
  if redis.call('HEXISTS', Q.sstate, sid) == 0 then
    redis.call('ZREM', Q.sessions, sid)
    redis.call('ZREM', Q.supdated, sid)
    if Q.sactive then redis.call('HDEL', Q.sactive, sid) end
    return true
  end
  noteIdleSession(Q, sid, { stateful = true, empty = true })
  return false
end
