--[[
  renewMessageLocks: extend the locks of delivered messages by LockDuration from now, or to a
  given time (a transaction holding the messages it settled until its discharge), all or
  none. A session message's lock is its session's: it is reported, not extended (the session
  lock is renewed with renewSessionLock).

  Invariant: only a live lock is extended; a lock held to a given time is never shortened.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] entity: 'q' or 'd'
    ARGV[c+2] ms to hold the locks to ('': LockDuration from now)
    ARGV[c+3..] lock tokens

  Output:
    { 0, locked-until ms per token }
    { -1 } MESSAGE_LOCK_LOST: some token is not a live lock (nothing changed)

  Events:
    none
]]
--- @include "queueContext"
--- @include "lockedMessage"
--- @include "writeMeta"
--- @include "sessionLockedUntil"

local Q = queueContext(0, 0)
local E = Q[ARGV[QUEUE_ARGC + 1]]
local found = {}
for i = QUEUE_ARGC + 3, #ARGV do
  local seq, m = lockedMessage(E, ARGV[i])
  if not seq then return { -1 } end
  if m.ss then
    if not sessionLockedUntil(Q, m.sid, false) then return { -1 } end
  elseif m.lu <= Q.now then
    return { -1 }
  end
  found[#found + 1] = { seq, m }
end

local out = { 0 }
local hold = tonumber(ARGV[QUEUE_ARGC + 2])
for _, f in ipairs(found) do
  local seq, m = f[1], f[2]
  if m.ss then
    out[#out + 1] = sessionLockedUntil(Q, m.sid, false)
  else
    local lockedUntil = Q.now + Q.lockMs
    if hold then lockedUntil = math.max(hold, m.lu) end
    m.lu = lockedUntil
    redis.call('ZADD', E.locked, lockedUntil, seq)
    writeMeta(E, seq, m)
    out[#out + 1] = lockedUntil
  end
end
return out
