--- @include "deadLetter"
--- @include "countEvent"
-- A message past its time to live: dropped, or dead-lettered when the queue says so.
local function expireMessage(Q, seq, m)
  if Q.dlOnExp then
    deadLetter(Q, seq, m, 'TTLExpiredException', 'The message expired and was dead lettered.')
  else
    deleteMessage(Q, Q.q, seq, m)
  end
  Q.expiredMessages = Q.expiredMessages + 1
  countEvent(Q, Q.q, 'expired')
end
