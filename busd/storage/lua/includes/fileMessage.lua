--- @include "seqMember"
--- @include "writeMeta"
--- @include "freeSession"
--- @include "wakeHolder"
--- @include "wakeWaiters"
-- Put a detached message into the index of its state m.st ('a', 'd' or 's'; locking is
-- lockMessage's job) and save its metadata. An available message wakes exactly who can take
-- it: its session's holder; else, for a session that just became free, one waiting
-- next-available receiver; else (no session) one waiting receiver of the entity. `blob`: the
-- body of a message new to E, stored with its metadata.
-- With `Q.filed` (a table, lua/sendMessages.lua: a call that only adds messages, so no holder
-- changes and every later message has a higher seq) a session's holder is read and the
-- session filed as free once per call: a batch of n messages of one session costs one look.
local function fileMessage(Q, E, seq, m, blob)
  local st = m.st
  if st == 'a' then
    if m.ss then
      redis.call('ZADD', E.sready, 0, seqMember(m.sid, seq))
      local filed = Q.filed
      local holder = filed and filed[m.sid]
      if holder == nil then
        holder = redis.call('HGET', Q.sholder, m.sid)
        if not holder then
          -- LT: an older message (abandoned, or scheduled earlier) moves the session forward
          freeSession(Q, m.sid, seq)
        else
          wakeHolder(Q, holder)
        end
        if filed then filed[m.sid] = holder end
      end
    else
      redis.call('ZADD', E.ready, seq, seq)
      wakeWaiters(Q, E.waiters, 1)
    end
    if m.exp and not E.dlq then redis.call('ZADD', E.ttl, m.exp, seq) end
  elseif st == 'd' then
    redis.call('ZADD', E.deferred, seq, seq)
  elseif st == 's' then
    redis.call('ZADD', E.sched, m.sch, seq)
  end
  writeMeta(E, seq, m, blob)
end
