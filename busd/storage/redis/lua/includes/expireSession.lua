--- @include "sessionMembers"
--- @include "memberSeq"
--- @include "readMeta"
--- @include "expireMessage"
-- Session-wide expiry: every message of the session that is not locked (available or
-- deferred) expires. Scheduled messages are not enqueued yet and stay.
local function expireSession(Q, sid)
  for _, member in ipairs(sessionMembers(Q.q, sid)) do
    local seq = memberSeq(member)
    local m = readMeta(Q.q, seq)
    if m and (m.st == 'a' or m.st == 'd') then expireMessage(Q, seq, m) end
  end
end
