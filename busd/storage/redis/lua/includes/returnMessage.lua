--- @include "unindexMessage"
--- @include "deadLetter"
--- @include "deadLetterSession"
--- @include "fileMessage"
--- @include "expireIfDue"
--- @include "backoffDue"
-- Unlock a locked message. `failed` (abandon, lock expiry) counts a delivery attempt and
-- dead-letters at MaxDeliveryCount (never in the DLQ itself), with its whole session when the
-- queue says so (docs/design.md §2.9). It becomes available again
-- (deferred again when it was fetched out of the deferred state) and may expire right away;
-- after a failed attempt on a queue with a redelivery backoff, available once it is due
-- (m.due, docs/design.md §2.17).
local function returnMessage(Q, E, seq, m, failed, patch)
  unindexMessage(Q, E, seq, m)
  if patch then m.pp = patch end
  if failed then
    m.dc = m.dc + 1
    if not E.dlq and m.dc >= Q.maxDc then
      local why = ' could not be consumed after ' .. Q.maxDc .. ' delivery attempts.'
      deadLetter(Q, seq, m, 'MaxDeliveryCountExceeded', 'Message' .. why)
      if Q.dlSession and m.ss then
        deadLetterSession(Q, m.sid, 'MaxDeliveryCountExceeded',
          'Dead-lettered with its session: message ' .. seq .. why, seq)
      end
      return
    end
  end
  if m.wd then m.st = 'd' else m.st = 'a' end
  if failed and m.st == 'a' and not E.dlq then m.due = backoffDue(Q, m.dc) or nil end
  m.wd = nil
  fileMessage(Q, E, seq, m)
  if m.st == 'a' and not E.dlq then expireIfDue(Q, seq, m) end
end
