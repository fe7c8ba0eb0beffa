--- @include "sessionMembers"
--- @include "seqMember"
--- @include "memberSeq"
-- The sequence numbers of session `sid`'s messages on entity E, from `from` on, in order, at
-- most `limit` (includes/sessionMembers.lua).
local function sessionSeqs(E, sid, from, limit)
  local seqs = {}
  for i, member in ipairs(sessionMembers(E, sid, seqMember(sid, from), limit)) do
    seqs[i] = memberSeq(member)
  end
  return seqs
end
