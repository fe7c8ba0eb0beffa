--- @include "seqMember"
--- @include "writeMeta"
--- @include "freeSession"
--- @include "wakeHolder"
--- @include "wakeWaiters"
--- @include "refreshFreeSession"
--- @include "sessionHolder"
--- @include "unbook"
--- @include "addTo"
-- Put a detached message into the index of its state m.st ('a', 'd' or 's'; locking is
-- lockMessage's job) and save its metadata. An available message wakes exactly who can take
-- it: its session's holder; else, for a session that just became free, one waiting
-- next-available receiver; else (no session) one waiting receiver of the entity. `blob`: the
-- body of a message new to E, stored with its metadata.
-- An available message waiting out its redelivery backoff (m.due, docs/design.md §2.17) wakes
-- no one: it is filed in `backoff` instead of `ready`; under a session, in `sready` too (it
-- keeps its place) while its session is not free (includes/refreshFreeSession.lua).
-- With `Q.filed` (a table, lua/sendMessages.lua and lua/publishMessages.lua: a call that only
-- adds messages, so no holder changes and every later message has a higher seq) a session's
-- holder is read and the session filed as free once per call: a batch of n messages of one
-- session costs one look.
-- A session message is in one of its session's indexes at a time (docs/design.md §3.4):
-- sready while available, sinflight while locked (includes/lockMessage.lua), sall while
-- deferred or scheduled. m.xs says it is out of sall; a message written by a store before
-- this layout lacks it and is in sall too, until it is filed or deleted.
-- A held session's standing offer ends when a message of it is filed available
-- (includes/unbook.lua).
-- A message coming back from flight under a session lock goes back into E.all (m.xa,
-- includes/lockMessage.lua).
local function fileMessage(Q, E, seq, m, blob)
  local st = m.st
  if m.xa then
    redis.call('ZADD', E.all, seq, seq)
    m.xa = nil
  end
  if m.ss and st == 'a' then
    if not m.xs then
      redis.call('ZREM', E.sall, seqMember(m.sid, seq))
      m.xs = 1
    end
  elseif m.xs then
    redis.call('ZADD', E.sall, 0, seqMember(m.sid, seq))
    m.xs = nil
  end
  if st == 'a' and m.due then
    redis.call('ZADD', E.backoff, m.due, seq)
    if m.ss then
      redis.call('ZADD', E.sready, 0, seqMember(m.sid, seq))
      if redis.call('HEXISTS', Q.sholder, m.sid) == 0 then
        refreshFreeSession(Q, m.sid, true)
      else
        unbook(Q, m.sid)
      end
    end
    if m.exp then redis.call('ZADD', E.ttl, m.exp, seq) end
  elseif st == 'a' then
    if m.ss then
      addTo(Q, 'ZADD', E.sready, 0, seqMember(m.sid, seq))
      local filed = Q.filed
      local holder = filed and filed[m.sid]
      if holder == nil then
        holder = sessionHolder(Q, m.sid)
        if not holder then
          -- LT: an older message (abandoned, or scheduled earlier) moves the session forward
          if Q.bo then
            refreshFreeSession(Q, m.sid, true) -- not free while its first message waits
          else
            freeSession(Q, m.sid, seq)
          end
        else
          wakeHolder(Q, holder)
          unbook(Q, m.sid)
        end
        if filed then filed[m.sid] = holder end
      end
    else
      addTo(Q, 'ZADD', E.ready, seq, seq, nil, nil, nil, E.waiters) -- wakes one
    end
    if m.exp and not E.dlq then addTo(Q, 'ZADD', E.ttl, m.exp, seq) end
  elseif st == 'd' then
    redis.call('ZADD', E.deferred, seq, seq)
  elseif st == 's' then
    addTo(Q, 'ZADD', E.sched, m.sch, seq)
  end
  writeMeta(E, seq, m, blob, Q)
end
