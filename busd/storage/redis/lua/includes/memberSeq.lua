-- The sequence number at the end of a lexicographic index member (see seqMember).
local function memberSeq(member)
  return tonumber(string.sub(member, -16))
end
