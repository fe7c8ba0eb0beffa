--- @include "sessionRange"
--- @include "memberSeq"
--- @include "readMessage"
--- @include "expireIfDue"
--- @include "takeMessage"
--- @include "tokenAt"
-- Deliver up to `count` available messages of session `sid`, which the caller holds live until
-- `lockedUntil`, in sequence order, appending their delivery rows to `out`, and return how many
-- it took (the caller counts them 'received', once per call). `tokens`: the
-- call's lock tokens as one string (peek-lock), false for receive-and-delete. A message met
-- past its time to live expires with its whole session instead. A message waiting out its
-- redelivery backoff (docs/design.md §2.17) ends the call: the session's order holds, nothing
-- after it is delivered before it.
local function takeSessionMessages(Q, sid, count, tokens, lockedUntil, out)
  Q.held = sid -- held: not free whatever it has available (includes/refreshFreeSession.lua)
  local first = #out
  local lo, hi = sessionRange(sid)
  local waits = false
  while not waits and #out - first < count do
    local wanted = count - (#out - first)
    local members = redis.call('ZRANGEBYLEX', Q.q.sready, lo, hi, 'LIMIT', 0, wanted)
    for _, member in ipairs(members) do
      local seq = memberSeq(member)
      local m, body = readMessage(Q.q, seq)
      if not m or m.st ~= 'a' then
        redis.call('ZREM', Q.q.sready, member) -- not available (cannot happen; never loop on it)
      elseif Q.bo and m.due and m.due > Q.now then
        waits = true
        Q.waits = true -- (lua/receiveSessionMessages.lua: no standing offer past it)
        break
      elseif not expireIfDue(Q, seq, m) then
        local token = false
        if tokens then
          token = tokenAt(tokens, #out - first + 1)
          m.h = Q.caller or nil -- the holder (includes/checkSettlement.lua)
        end
        out[#out + 1] = takeMessage(Q, Q.q, seq, m, token, lockedUntil, body)
      end
    end
    -- fewer than asked: that was all of them (another look only replaces what was skipped)
    if #members < wanted then break end
  end
  return #out - first
end
