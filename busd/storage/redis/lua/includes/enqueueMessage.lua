--- @include "placeMessage"
-- Store a new message in the queue under the next sequence number (shared with the
-- dead-letter sub-queue; see placeMessage). Returns the sequence number. A call that adds
-- several reserves their numbers with one INCRBY first (`Q.nextSeq`, the first of them).
local function enqueueMessage(Q, blob, sid, ttl, due, sessionQueue, patch, extra)
  local seq = Q.nextSeq
  if seq then
    Q.nextSeq = seq + 1
  else
    seq = redis.call('INCR', Q.seq)
  end
  placeMessage(Q, seq, blob, sid, ttl, due, sessionQueue, patch, extra)
  return seq
end
