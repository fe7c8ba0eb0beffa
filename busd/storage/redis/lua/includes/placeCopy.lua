--- @include "placeMessage"
--- @include "placeDeadLetter"
-- Store a topic's copy of a message in subscription Q (includes/topicSubscriptions.lua) under
-- `seq`, unless Q is no longer live: its time to live capped by Q's default; dead-lettered
-- when Q requires sessions and the copy has no session id. Returns 1 when stored, else 0.
local function placeCopy(Q, seq, blob, sid, ttl, due, extra)
  if not Q.live then return 0 end
  if Q.maxTtl and (not ttl or Q.maxTtl < ttl) then ttl = Q.maxTtl end
  if Q.sessionQueue and not sid then
    placeDeadLetter(Q, seq, blob, nil, 'Session ID is null.',
      "Session enabled entity doesn't allow a message whose session identifier is null.", extra)
  else
    placeMessage(Q, seq, blob, sid, ttl, due, Q.sessionQueue, nil, extra)
  end
  Q.sent = Q.sent + 1
  return 1
end
