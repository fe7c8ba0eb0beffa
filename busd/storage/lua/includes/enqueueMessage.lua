--- @include "placeMessage"
-- Store a new message in the queue under the next sequence number (shared with the
-- dead-letter sub-queue; see placeMessage). Returns the sequence number.
local function enqueueMessage(Q, blob, sid, ttl, due, sessionQueue, patch, extra)
  local seq = redis.call('INCR', Q.seq)
  placeMessage(Q, seq, blob, sid, ttl, due, sessionQueue, patch, extra)
  return seq
end
