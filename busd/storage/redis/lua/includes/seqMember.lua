-- Member of a session's lexicographic index: <sid>\0<16-digit seq>, so that one session's
-- messages sort together and in sequence order (session ids never contain NUL).
local function seqMember(sid, seq)
  return sid .. '\0' .. string.format('%016d', seq)
end
