--- @include "memberSeq"
-- The sequence numbers of entity E's messages, any state, from `from` on, in order, at most
-- `limit`: E.all's, merged with those in flight under a session lock, which are out of E.all
-- (includes/lockMessage.lua). Those are read whole: they are as many as the session
-- receivers' credit lets be in flight, not as many as the entity holds.
local function messageSeqs(E, from, limit)
  local seqs = redis.call('ZRANGEBYSCORE', E.all, from, '+inf', 'LIMIT', 0, limit)
  local inflight = E.sinflight and redis.call('ZRANGE', E.sinflight, 0, -1) or {}
  if #inflight == 0 then return seqs end
  local seen, out = {}, {}
  for _, s in ipairs(seqs) do
    local seq = tonumber(s)
    seen[seq] = true
    out[#out + 1] = seq
  end
  for _, member in ipairs(inflight) do
    local seq = memberSeq(member)
    if seq >= from and not seen[seq] then -- seen: locked by a store before that layout
      seen[seq] = true
      out[#out + 1] = seq
    end
  end
  table.sort(out)
  for i = #out, limit + 1, -1 do out[i] = nil end
  return out
end
