--- @include "deadLetter"
--- @include "unindexMessage"
--- @include "fileMessage"
-- A locked message that cannot be forwarded (hop limit, destination gone) stays at its
-- source: dead-lettered there; in a dead-letter sub-queue, deferred with the reason, so that
-- its forwarder does not take it again. Returns 1 (dead-lettered) or 2 (deferred).
local function keepForwarded(Q, E, seq, m, reason, description)
  if E.dlq then
    unindexMessage(Q, E, seq, m)
    m.st, m.dlr, m.dld = 'd', reason, description
    fileMessage(Q, E, seq, m)
    return 2
  end
  deadLetter(Q, seq, m, reason, description)
  return 1
end
