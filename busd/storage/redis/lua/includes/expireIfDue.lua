--- @include "expireSession"
-- Expire an available message of the queue whose time has come (the whole session when it
-- is filed under one). Returns true when it expired.
local function expireIfDue(Q, seq, m)
  if not m.exp or m.exp > Q.now then return false end
  if m.ss then
    expireSession(Q, m.sid)
  else
    expireMessage(Q, seq, m)
  end
  return true
end
