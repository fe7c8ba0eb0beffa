--- @include "sessionMembers"
--- @include "memberSeq"
--- @include "readMeta"
--- @include "writeMeta"
--- @include "deadLetter"
--- @include "writeSessionState"
-- Move every message of session `sid` left in the queue (available, locked, deferred,
-- scheduled) to the dead-letter sub-queue, keeping their sequence numbers, so that they stay
-- in order there. The session's state goes with them: kept in the metadata of its oldest
-- dead letter (`sst`), it comes back when the session is resubmitted (docs/design.md §2.9).
-- `first`: a message of the session the caller has just dead-lettered itself (or nil).
-- A lock on the session stays with its holder. Returns how many messages moved.
local function deadLetterSession(Q, sid, reason, description, first)
  local moved = 0
  for _, member in ipairs(sessionMembers(Q.q, sid)) do
    local seq = memberSeq(member)
    local m = readMeta(Q.q, seq)
    if m then
      deadLetter(Q, seq, m, reason, description)
      moved = moved + 1
      if not first or seq < first then first = seq end
    end
  end
  local state = redis.call('HGET', Q.sstate, sid)
  if state and first then
    local d = readMeta(Q.d, first)
    d.sst = state
    writeMeta(Q.d, first, d)
    writeSessionState(Q, sid, false)
  end
  return moved
end
