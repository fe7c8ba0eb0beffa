--- @include "sessionRange"
--- @include "memberSeq"
--- @include "readMeta"
--- @include "deleteMessage"
--- @include "placeMessage"
--- @include "writeSessionState"
-- Move session `sid`'s available and deferred dead letters back into the session, each under
-- the sequence number it had: they come back in their original order and before any message
-- the session got since, however many calls they come back in. Delivery count 0, enqueued
-- now, living `ttl` ms from now. The state dead-lettered with the session comes back with it
-- unless the session has one by now (the newer one stays). Returns moved, left (the dead
-- letters a dead-letter receiver holds locked, which stay).
local function resubmitSessionLetters(Q, sid, ttl)
  local lo, hi = sessionRange(sid)
  local moved, left = 0, 0
  for _, member in ipairs(redis.call('ZRANGEBYLEX', Q.d.sall, lo, hi)) do
    local seq = memberSeq(member)
    local m = readMeta(Q.d, seq)
    if m and (m.st == 'a' or m.st == 'd') then
      local body = redis.call('HGET', Q.d.body, seq)
      deleteMessage(Q, Q.d, seq, m)
      placeMessage(Q, seq, body, sid, ttl, nil, true, m.pp)
      if m.sst and redis.call('HEXISTS', Q.sstate, sid) == 0 then
        writeSessionState(Q, sid, m.sst)
      end
      moved = moved + 1
    elseif m then
      left = left + 1
    end
  end
  return moved, left
end
