--- @include "forgetSessionIfEmpty"
-- Set (`state` a string) or clear (`state` false) a session's state, and its last-updated
-- time. The state keeps the session in existence after all its messages are gone.
-- The last-updated time is also the state's etag (docs/design.md §2.7): every write moves it
-- forward, by a millisecond past the last one when the clock has not, so no two writes of
-- a session share one. Returns it.
local function writeSessionState(Q, sid, state)
  if state then
    redis.call('HSET', Q.sstate, sid, state)
    redis.call('ZADD', Q.sessions, 0, sid)
  else
    redis.call('HDEL', Q.sstate, sid)
  end
  local at = Q.now
  local last = tonumber(redis.call('ZSCORE', Q.supdated, sid))
  if last and last >= at then at = last + 1 end
  redis.call('ZADD', Q.supdated, at, sid)
  forgetSessionIfEmpty(Q, sid)
  return at
end
