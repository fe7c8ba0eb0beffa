--- @include "unindexMessage"
--- @include "metaField"
--- @include "legacyMeta"
--- @include "forgetSessionIfEmpty"
--- @include "removeFrom"
-- Delete a message. A session left without messages (and state) ceases to exist: at once, or,
-- when the script collects them in Q.emptied (a list), once per session when it is done.
-- Its body and its place in E.all go in the call's batch of removals when it has one
-- (includes/removeFrom.lua).
local function deleteMessage(Q, E, seq, m)
  unindexMessage(Q, E, seq, m)
  removeFrom(Q, 'HDEL', E.body, seq, metaField(seq))
  legacyMeta(E, seq, true)
  if m.xa then -- it was in flight under a session lock: not in E.all (includes/lockMessage.lua)
    m.xa = nil
  else
    removeFrom(Q, 'ZREM', E.all, seq)
  end
  if m.sid then
    if not m.xs then redis.call('ZREM', E.sall, seqMember(m.sid, seq)) end
    if m.ss then
      local emptied = Q.emptied
      if not emptied then
        forgetSessionIfEmpty(Q, m.sid)
      elseif not emptied[m.sid] then
        emptied[m.sid] = true
        emptied[#emptied + 1] = m.sid
      end
    end
  end
end
