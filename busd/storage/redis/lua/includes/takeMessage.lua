--- @include "unindexMessage"
--- @include "deleteMessage"
--- @include "lockMessage"
--- @include "deliveryRow"
-- Deliver a message: lock it under `token` (peek-lock) or delete it (receive-and-delete,
-- token false). Returns its delivery row. A message taken out of the deferred state is
-- reported as deferred and, when locked, goes back there if not settled (wd). The caller
-- counts the deliveries ('received'), once for all the messages it took. `body`: the
-- message's body when the caller read it with its metadata (includes/readMeta.lua).
local function takeMessage(Q, E, seq, m, token, lockedUntil, body)
  if body == nil then body = redis.call('HGET', E.body, seq) end
  if m.st == 'd' then m.wd = 1 end
  if token then
    unindexMessage(Q, E, seq, m)
    lockMessage(Q, E, seq, m, token, lockedUntil)
    return deliveryRow(seq, body, m, m.tok, lockedUntil)
  end
  deleteMessage(Q, E, seq, m)
  return deliveryRow(seq, body, m, false, false)
end
