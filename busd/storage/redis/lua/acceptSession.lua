--[[
  acceptSession: lock a session for a holder, either a specific one or the next available,
  and take its first messages in the same step (as receiveSessionMessages would next): a
  receiver that already has credit needs one store call, not two queued behind each other.

  Specific: locked when free or its lock expired (the expired lock's in-flight messages count
  a failed attempt first); extended when the same holder already holds it live; refused when
  someone else holds it live. The session may have no messages.
  Next available: the free session (available messages, no holder) whose oldest available
  message is the oldest, found in O(log n) of the free sessions. Scripts run one at a time,
  so concurrent acceptors get different sessions. With none free, a caller that will wait is
  registered as a waiter in the same step, so no session that becomes free afterwards can be
  missed: it wakes the oldest waiter (includes/freeSession.lua).

  Release-and-accept-next: given a session and its holder to release first (a receiver of the
  same connection that lets its session go as the next one attaches), that lock is released
  as releaseSession does, in the same call.

  Housekeeping first (bounded): expired locks, due scheduled messages, expired messages
  (session-wide).

  Invariant: a session has at most one holder; a held session is not in sfree, and is in
  sessions.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] holder
    ARGV[c+2] session id ('' next available)
    ARGV[c+3] next available: '1' to wait (register the holder as a waiter when none is
              free), '0' not to, or the id to register instead of the holder's (a process
              that waits for its acceptors, busd/storage/partitioned/waits.py)
    ARGV[c+4] receive mode of the first messages: '1' peek-lock, '0' receive-and-delete
    ARGV[c+5] how many messages to take once locked (0: none)
    ARGV[c+6] peek-lock: the lock tokens, 16 bytes each, one per message (at least ARGV[c+5]),
              as one string
    ARGV[c+7] the holder's connection, for the session inspector: '<client container
              id>\0<client address>' ('' unknown)
    ARGV[c+8] '1' when an earlier call may have registered the holder as a waiter (it is
              then taken off the waiters once it locks a session), '0' when none did
    ARGV[c+9] a session to release first ('' none; optional)
    ARGV[c+10] its holder (the releasing receiver's; with ARGV[c+9])

  Output:
    { 0, session id, locked-until ms, delivery row, ... } (includes/deliveryRow.lua; the
    messages taken, in sequence order, their lock the session's)
    { -3 } SESSION_CANNOT_BE_LOCKED: held live by another holder
    { -5 } NO_SESSION_AVAILABLE (next available only; registered as a waiter if asked)

  Events:
    wake-ups (includes/wakeWaiters.lua) when housekeeping made messages or sessions available
]]
--- @include "queueContext"
--- @include "housekeeping"
--- @include "unlockSession"
--- @include "releaseSessionLock"
--- @include "takeSessionMessages"
--- @include "countEvent"
--- @include "noteActivity"

local Q = queueContext(0, 0)
local holder = ARGV[QUEUE_ARGC + 1]
local sid = ARGV[QUEUE_ARGC + 2]
Q.caller = holder
local releasing = ARGV[QUEUE_ARGC + 9]
if releasing and releasing ~= '' then
  releaseSessionLock(Q, ARGV[QUEUE_ARGC + 10], releasing, false)
end
housekeeping(Q, Q.q)

local nextAvailable = sid == ''
if not nextAvailable then
  local current = redis.call('HGET', Q.sholder, sid)
  if current then
    local until_ = tonumber(redis.call('ZSCORE', Q.slocks, sid))
    if until_ and until_ > Q.now then
      if current ~= holder then return { -3 } end
    else
      unlockSession(Q, sid, true)
    end
  end
else
  -- taken off the free sessions in the same command that finds it: it is locked below
  sid = redis.call('ZPOPMIN', Q.sfree)[1]
  if not sid then
    local wait = ARGV[QUEUE_ARGC + 3]
    if wait == '1' then
      redis.call('ZADD', Q.swaiters, Q.now, holder)
    elseif wait ~= '0' then
      redis.call('ZADD', Q.swaiters, Q.now, wait)
    end
    return { -5 }
  end
  if ARGV[QUEUE_ARGC + 8] == '1' then redis.call('ZREM', Q.swaiters, holder) end
end

local lockedUntil = Q.now + Q.lockMs
redis.call('HSET', Q.sholder, sid, holder)
redis.call('ZADD', Q.slocks, lockedUntil, sid)
if not nextAvailable then redis.call('ZREM', Q.sfree, sid) end
-- A held session is in `sessions` while held, whatever it has (a send hands it messages
-- without filing it there, includes/placeMessage.lua); one without messages or state is not
-- listed (includes/unlistedSession.lua) and its lock's end forgets it. A free session has
-- available messages, so it is there already.
if not nextAvailable then redis.call('ZADD', Q.sessions, 0, sid) end
-- Its last activity is now, so its settles of the next second write none; the holder's
-- connection ('' unknown) goes beside it, for the session inspector (includes/noteActivity.lua).
noteActivity(Q, sid, true, ARGV[QUEUE_ARGC + 7] or '')
local out = { 0, sid, lockedUntil }
local count = tonumber(ARGV[QUEUE_ARGC + 5])
if count > 0 then
  local tokens = false
  if ARGV[QUEUE_ARGC + 4] == '1' then tokens = ARGV[QUEUE_ARGC + 6] end
  countEvent(Q, Q.q, 'received', takeSessionMessages(Q, sid, count, tokens, lockedUntil, out))
end
return out
