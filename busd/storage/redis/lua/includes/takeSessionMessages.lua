--- @include "sessionRange"
--- @include "memberSeq"
--- @include "metaField"
--- @include "legacyMeta"
--- @include "expireIfDue"
--- @include "takeMessage"
--- @include "deliveryRow"
--- @include "tokenAt"
--- @include "lockToken"
-- Deliver up to `count` available messages of session `sid`, which the caller holds live until
-- `lockedUntil`, in sequence order, appending their delivery rows to `out`, and return how many
-- it took (the caller counts them 'received', once per call). `tokens`: the
-- call's lock tokens as one string (peek-lock), false for receive-and-delete. A message met
-- past its time to live expires with its whole session instead. A message waiting out its
-- redelivery backoff (docs/design.md §2.17) ends the call: the session's order holds, nothing
-- after it is delivered before it.
--
-- The usual message, available and locked for the holder, moves as includes/takeMessage.lua
-- moves it, but in one command per index for all the messages of a look, not one per message:
-- its metadata and body read in one HMGET, out of sready, into sinflight, out of E.all and its
-- metadata written in one command each (a session's first messages cost its accept 5 commands
-- each otherwise, docs/design.md §3.19). What is not usual goes through takeMessage, after
-- what was gathered is written.
local LOOK = 500
local function takeSessionMessages(Q, sid, count, tokens, lockedUntil, out)
  Q.held = sid -- held: not free whatever it has available (includes/refreshFreeSession.lua)
  local E = Q.q
  local first = #out
  local lo, hi = sessionRange(sid)
  local waits = false
  local ready, inflight, all, ttl, metas, seqs = {}, {}, {}, {}, {}, {}
  local function flush()
    if #seqs == 0 then return end
    redis.call('ZREM', E.sready, unpack(ready))
    redis.call('ZADD', E.sinflight, unpack(inflight))
    if #all > 0 then redis.call('ZREM', E.all, unpack(all)) end
    if #ttl > 0 then redis.call('ZREM', E.ttl, unpack(ttl)) end
    redis.call('HSET', E.body, unpack(metas))
    for _, seq in ipairs(seqs) do legacyMeta(E, seq, true) end
    ready, inflight, all, ttl, metas, seqs = {}, {}, {}, {}, {}, {}
  end
  while not waits and #out - first < count do
    -- at most LOOK a look: what one look moves goes to the server as one command's arguments
    local wanted = math.min(count - (#out - first), LOOK)
    local members = redis.call('ZRANGEBYLEX', E.sready, lo, hi, 'LIMIT', 0, wanted)
    local fields = {}
    for i, member in ipairs(members) do
      local seq = memberSeq(member)
      fields[2 * i - 1], fields[2 * i] = metaField(seq), seq
    end
    local got = #members > 0 and redis.call('HMGET', E.body, unpack(fields)) or {}
    for i, member in ipairs(members) do
      local seq = memberSeq(member)
      local raw, body = got[2 * i - 1] or legacyMeta(E, seq), got[2 * i]
      local m = raw and cmsgpack.unpack(raw)
      if not m or m.st ~= 'a' then
        redis.call('ZREM', E.sready, member) -- not available (cannot happen; never loop on it)
      elseif Q.bo and m.due and m.due > Q.now then
        waits = true
        Q.waits = true -- (lua/receiveSessionMessages.lua: no standing offer past it)
        break
      elseif m.exp and m.exp <= Q.now then
        -- its whole session expires (includes/expireSession.lua): nothing is left to take
        flush()
        expireIfDue(Q, seq, m)
        waits = true
        break
      else
        local token = false
        if tokens then
          token = tokenAt(tokens, #out - first + 1)
          m.h = Q.caller or nil -- the holder (includes/checkSettlement.lua)
        end
        if token and m.ss and m.xs and not (m.due or m.fl) then
          ready[#ready + 1] = member
          inflight[#inflight + 1] = 0
          inflight[#inflight + 1] = member
          if not m.xa then all[#all + 1] = seq end
          if m.exp then ttl[#ttl + 1] = seq end
          m.st, m.tok, m.xa = 'l', lockToken(token, seq), 1
          metas[#metas + 1] = metaField(seq)
          metas[#metas + 1] = cmsgpack.pack(m)
          seqs[#seqs + 1] = seq
          out[#out + 1] = deliveryRow(seq, body, m, m.tok, lockedUntil)
        else
          flush()
          out[#out + 1] = takeMessage(Q, E, seq, m, token, lockedUntil, body)
        end
      end
    end
    flush()
    -- fewer than asked: that was all of them (another look only replaces what was skipped)
    if #members < wanted then break end
  end
  return #out - first
end
