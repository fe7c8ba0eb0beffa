--- @include "clientField"
--- @include "sessionHasMessages"
--- @include "noteIdleSession"
-- A session exists while it has messages or state; one left with only its state and no
-- holder is idle from now. True when the session was forgotten (it had neither). A held
-- session stays in `sessions` while held, whatever it has (a send that hands it a message
-- relies on that, includes/placeMessage.lua): its lock's end forgets it
-- (includes/unlockSession.lua). `known` names what the caller has just checked, so it is not
-- read again: `unheld` (no holder), `empty` (no messages).
local function forgetSessionIfEmpty(Q, sid, known)
  known = known or {}
  if not known.unheld
      and (Q.held == sid or redis.call('HEXISTS', Q.sholder, sid) == 1) then
    return false
  end
  -- (an unheld session has messages in flight while its lock's end returns them one by
  -- one, includes/unlockSession.lua)
  if not known.empty and sessionHasMessages(Q, sid) then return false end
  if redis.call('HEXISTS', Q.sstate, sid) == 0 then
    redis.call('ZREM', Q.sessions, sid)
    redis.call('ZREM', Q.supdated, sid)
    if Q.sactive then redis.call('HDEL', Q.sactive, sid, clientField(sid)) end
    return true
  end
  noteIdleSession(Q, sid, { stateful = true, empty = true })
  return false
end
