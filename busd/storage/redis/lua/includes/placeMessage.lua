--- @include "seqMember"
--- @include "fileMessage"
--- @include "lockMessage"
--- @include "deliveryRow"
--- @include "sessionHolder"
--- @include "addTo"
-- Store a new message under sequence number `seq`: enqueued now, or at `due` when that is
-- later (scheduled; its time to live then counts from its activation). On a session queue
-- (`sessionQueue`) a message with a session id is filed under its session, which exists from
-- now on. `patch` is a properties patch to keep (a resubmitted message keeps its own);
-- `extra`, metadata fields to set besides (a forwarded message's: includes/readMeta.lua).
-- With `Q.handOver` ({ token, lockedUntil, holder }, set by lua/sendMessages.lua), a session
-- message available now is locked for its session's holder instead of filed, and its delivery
-- row left in Q.handOver.row; it is not put in Q.q.all, which leaves out messages in flight
-- under a session lock (includes/lockMessage.lua).
local function placeMessage(Q, seq, blob, sid, ttl, due, sessionQueue, patch, extra)
  local m = { dc = 0, pp = patch }
  if extra then
    for k, v in pairs(extra) do m[k] = v end
  end
  local h = Q.handOver
  local scheduled = due and due > Q.now
  local handed = h and sid and sessionQueue and not scheduled
  if sid then
    m.sid = sid
    -- A session message is in one of its session's indexes at a time (fileMessage): handed
    -- over, in sinflight; available, in sready; scheduled, in sall. On a queue without
    -- sessions, the session id's index is sall.
    if sessionQueue and not scheduled then
      m.xs = 1
    else
      addTo(Q, 'ZADD', Q.q.sall, 0, seqMember(sid, seq))
    end
    if sessionQueue then
      m.ss = 1
      -- `Q.added` (a table, lua/sendMessages.lua, lua/publishMessages.lua): a call that removes
      -- no session adds each once.
      -- A message handed over goes to a held session, which is there already
      -- (lua/acceptSession.lua); so does one filed available under a held session, where the
      -- call reads holders once (`Q.holders`, includes/sessionHolder.lua): fileMessage reads
      -- the holder to wake it anyway.
      local added = Q.added
      if not (added and added[sid]) and not handed
          and not (Q.holders and not scheduled and sessionHolder(Q, sid)) then
        addTo(Q, 'ZADD', Q.sessions, 0, sid)
        if added then added[sid] = true end
      end
    end
  end
  if scheduled then
    m.st = 's'
    m.sch = due
    m.enq = due
    m.ttl = ttl
  else
    m.st = 'a'
    m.enq = Q.now
    if ttl then m.exp = Q.now + ttl end
  end
  if handed then
    m.h = h.holder
    lockMessage(Q, Q.q, seq, m, h.token, h.lockedUntil, blob)
    h.row = deliveryRow(seq, blob, m, m.tok, h.lockedUntil)
  else
    addTo(Q, 'ZADD', Q.q.all, seq, seq)
    fileMessage(Q, Q.q, seq, m, blob)
  end
end
