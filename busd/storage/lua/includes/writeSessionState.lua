--- @include "forgetSessionIfEmpty"
-- Set (`state` a string) or clear (`state` false) a session's state, and its last-updated
-- time. The state keeps the session in existence after all its messages are gone.
local function writeSessionState(Q, sid, state)
  if state then
    redis.call('HSET', Q.sstate, sid, state)
    redis.call('ZADD', Q.sessions, 0, sid)
  else
    redis.call('HDEL', Q.sstate, sid)
  end
  redis.call('ZADD', Q.supdated, Q.now, sid)
  forgetSessionIfEmpty(Q, sid)
end
