-- What the broker gets back for one message: seq, body, delivery count, enqueued ms,
-- session id, lock token, locked-until ms, expires ms, state (0 active, 1 deferred,
-- 2 scheduled), dead-letter reason, dead-letter description, properties patch; for a
-- forwarded message also the sequence number it was first given and its dead-letter source.
-- false becomes a null reply.
local function deliveryRow(seq, body, m, token, lockedUntil)
  local state = 0
  if m.st == 'd' or m.wd then state = 1 elseif m.st == 's' then state = 2 end
  local row = { seq, body, m.dc, m.enq, m.sid or false, token or false, lockedUntil or false,
                m.exp or false, state, m.dlr or false, m.dld or false, m.pp or false }
  if m.fs then  -- a forwarded message
    row[13] = m.fs
    row[14] = m.dls or false
  end
  return row
end
