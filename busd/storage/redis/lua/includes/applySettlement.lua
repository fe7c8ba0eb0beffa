--- @include "deleteMessage"
--- @include "returnMessage"
--- @include "unindexMessage"
--- @include "fileMessage"
--- @include "deadLetter"
-- Apply a settlement checked by checkSettlement: 'complete' deletes; 'abandon' unlocks with a
-- counted failed attempt; 'release' without; 'defer' unlocks into the deferred state;
-- 'dead-letter' moves the message to the dead-letter sub-queue with reason and description
-- (in the dead-letter sub-queue itself it stays there, unlocked, with the new ones). `patch`
-- (false: none) is kept and handed back with later deliveries. Returns the event to count on
-- E, or false when deadLetter counted it.
local function applySettlement(Q, E, seq, m, outcome, reason, description, patch)
  if outcome == 'complete' then
    deleteMessage(Q, E, seq, m)
    return 'completed'
  elseif outcome == 'abandon' then
    returnMessage(Q, E, seq, m, true, patch)
    return 'abandoned'
  elseif outcome == 'release' then
    returnMessage(Q, E, seq, m, false, patch)
    return 'released'
  elseif outcome == 'defer' then
    unindexMessage(Q, E, seq, m)
    if patch then m.pp = patch end
    m.st = 'd'
    m.wd = nil
    fileMessage(Q, E, seq, m)
    return 'deferred'
  end
  -- dead-letter
  if patch then m.pp = patch end
  if E.dlq then
    unindexMessage(Q, E, seq, m)
    m.dlr = reason
    m.dld = description
    m.st = 'a'
    m.wd = nil
    fileMessage(Q, E, seq, m)
    return 'deadlettered'
  end
  deadLetter(Q, seq, m, reason, description)
  return false
end
