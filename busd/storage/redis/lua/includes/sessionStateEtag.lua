-- The etag of a session's state (its last-updated time, includes/writeSessionState.lua), as
-- text; false when the session has no state.
local function sessionStateEtag(Q, sid)
  if redis.call('HEXISTS', Q.sstate, sid) == 0 then return false end
  return string.format('%d', tonumber(redis.call('ZSCORE', Q.supdated, sid)))
end
