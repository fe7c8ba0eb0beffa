--- @include "placeCopy"
--- @include "placeDeadLetter"
-- Store one message sent to a topic T in the subscriptions `subs` (includes/
-- topicSubscriptions.lua) under the topic's next sequence number. Without placements (np < 0)
-- every live subscription gets it unchanged; else the np placements of seven at ARGV[first ..]
-- say where its copies go: subscription index (1-based), flags (1 own blob, 2 own session id,
-- 4 own time to live, 8 dead-letter), blob, session id, time to live, dead-letter reason,
-- dead-letter description ('' where a flag is unset). A second copy in one subscription takes
-- a number of its own (a subscription keeps messages by number); a copy for a session
-- subscription without a session id is dead-lettered there. `extra`: metadata every copy
-- carries (a forwarded message's, lua/forwardMessages.lua). A send staged in a transaction
-- (lua/commitTransaction.lua) passes the rest: `reserved`, the number taken for it already
-- (nil: the topic's next); `P`, the array holding its placements (nil: ARGV); `pick`, the
-- index in `subs` of a placement's subscription field (nil: the field is the index; a
-- subscription it cannot find, nil, gets no copy). Returns the topic's number and how many
-- copies were stored (0: nobody took it).
local function fanOutMessage(T, subs, blob, sid, ttl, due, np, first, extra, reserved, P, pick)
  P = P or ARGV
  pick = pick or tonumber
  local seq = reserved or redis.call('INCR', T.seq)
  local placed = 0
  if np < 0 then
    for s = 1, #subs do placed = placed + placeCopy(subs[s], seq, blob, sid, ttl, due, extra) end
    return seq, placed
  end
  local used = {}
  for p = first, first + 7 * (np - 1), 7 do
    local si = pick(P[p])
    local Q = si and subs[si]
    if Q then
      local cseq = seq
      if used[si] then cseq = redis.call('INCR', T.seq) end
      used[si] = true
      local flags = tonumber(P[p + 1])
      local pblob, psid, pttl = blob, sid, ttl
      if bit.band(flags, 1) ~= 0 then pblob = P[p + 2] end
      if bit.band(flags, 2) ~= 0 then
        psid = P[p + 3]
        if psid == '' then psid = nil end
      end
      if bit.band(flags, 4) ~= 0 then pttl = tonumber(P[p + 4]) end
      if bit.band(flags, 8) ~= 0 then
        if Q.live then
          placeDeadLetter(Q, cseq, pblob, psid, P[p + 5], P[p + 6], extra)
          Q.sent = Q.sent + 1
          placed = placed + 1
        end
      else
        placed = placed + placeCopy(Q, cseq, pblob, psid, pttl, due, extra)
      end
    end
  end
  return seq, placed
end
