--[[
  sendMessages: enqueue a batch of messages, all or none (one script call per batch).

  Each accepted message gets the queue's next sequence number (shared with the dead-letter
  sub-queue, so a dead-lettered message keeps it) and is enqueued now, or at its due time
  when scheduled in the future (then it is invisible until activateScheduled files it).
  A message with a session id is filed under its session on a session queue.

  Hand-over: the sending process names, per session, a receiver of its own that holds the
  session, has credit and has nothing under way (an offer). A message of that session that is
  available at once goes straight to the holder, locked under one of the offer's tokens, when
  the holder's lock is live and the session has no other available message: it is then the
  next message of the session in order, and the holder's own receive (and the wake-up that
  would have led to it) is saved. Each offer takes at most its count; once a message of the
  session is filed available instead, none after it is handed over (docs/design.md §3.5).
  A session held by a receiver of another process is handed over likewise under the standing
  offer its holder left in `sbook` (lua/receiveSessionMessages.lua): the message is locked for
  that holder under the offer's token bytes, and the call publishes the delivery rows on the
  holder's channel (includes/packRows.lua) instead of a wake-up; its process delivers them
  without a receive call of its own.

  Invariant: with duplicate detection on, a message id accepted within the last `window` ms
  is not accepted again; every message is in q.body (body and metadata) and the index of
  its state, and in q.all unless handed over (then locked, in q.sinflight and out of q.all,
  as receiveSessionMessages leaves it: includes/lockMessage.lua).

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] duplicate detection window ms (0: off)
    ARGV[c+2] '1' when the queue requires sessions
    ARGV[c+3] k: the number of hand-over offers, then four per offer: session id, holder,
              the most messages it takes, its lock tokens (16 bytes each) as one string
    ARGV[c+4+4k..] five per message: blob, session id ('' none), message id ('' none),
              time to live ms ('' unbounded; already capped by the queue's default),
              scheduled enqueue time ms ('' none)

  Output:
    array: the sequence number of each message, 0 for a duplicate that was dropped; then,
    per offer in order, the array of the delivery rows handed over to it
    (includes/deliveryRow.lua; locked-until is the session's)

  Events:
    wake-ups (includes/wakeWaiters.lua) when a message is available now and not handed over;
    none to a holder offered in this call: its process sees from the rows returned that the
    session got more than was handed over, and has that holder look again itself. Per holder
    of a standing offer that took messages: '<holder>\n' and their packed delivery rows on
    its process's channel
]]
--- @include "queueContext"
--- @include "enqueueMessage"
--- @include "sessionLockedUntil"
--- @include "sessionRange"
--- @include "tokenAt"
--- @include "countEvent"
--- @include "sessionHolder"
--- @include "packRows"
--- @include "flushAdds"

local Q = queueContext(0, 0)
local window = tonumber(ARGV[QUEUE_ARGC + 1])
local sessionQueue = ARGV[QUEUE_ARGC + 2] == '1'
local offers, offerList = {}, {}
local first = QUEUE_ARGC + 4
for _ = 1, tonumber(ARGV[QUEUE_ARGC + 3]) do
  local o = { holder = ARGV[first + 1], left = tonumber(ARGV[first + 2]),
              tokens = ARGV[first + 3], rows = {} }
  offers[ARGV[first]] = o
  offerList[#offerList + 1] = o
  Q.woken[o.holder] = true -- see Events
  first = first + 4
end

-- The standing offer of session `sid`'s holder (lua/receiveSessionMessages.lua), read once
-- per call, or false: only of a held session whose holder holds a live lock (one left by an
-- earlier holder is inert). It stands only while the session has nothing available
-- (includes/unbook.lua), so what it takes is the session's next message.
local books, bookList = {}, {}
Q.books = books
local function standingOffer(sid)
  local o = books[sid]
  if o ~= nil then return o end
  o = false
  local holder = sessionHolder(Q, sid)
  local raw = holder and redis.call('HGET', Q.sbook, sid)
  if raw and string.sub(raw, 9) == holder then
    local lockedUntil = tonumber(redis.call('ZSCORE', Q.slocks, sid))
    if lockedUntil and lockedUntil > Q.now then
      o = { holder = holder, lockedUntil = lockedUntil, left = math.huge, rows = {},
            token = string.rep('\0', 8) .. string.sub(raw, 1, 8) }
      bookList[#bookList + 1] = o
    end
  end
  books[sid] = o
  return o
end

-- The offer that takes a message of session `sid` enqueued now, or false. Checked once per
-- offer: the holder's lock is live and the session has nothing available before it.
local function offerFor(sid)
  if sessionQueue and sid and not offers[sid] then
    local o = standingOffer(sid)
    return o and books[sid] and o
  end
  local o = sessionQueue and sid and offers[sid]
  if not o or o.left <= 0 then return false end
  if not o.lockedUntil then
    local lockedUntil = sessionLockedUntil(Q, sid, o.holder)
    local lo, hi = sessionRange(sid)
    if not lockedUntil
        or #redis.call('ZRANGEBYLEX', Q.q.sready, lo, hi, 'LIMIT', 0, 1) > 0 then
      o.left = 0
      return false
    end
    o.lockedUntil = lockedUntil
  end
  return o
end

if window > 0 then
  -- ids older than the window no longer count (amortised: each id is removed once)
  redis.call('ZREMRANGEBYSCORE', Q.dedup, '-inf', Q.now - window)
end

-- Duplicates first, in order, so that the accepted messages' numbers are reserved at once.
local duplicate = {}
local duplicates = 0
if window > 0 then
  for i = first, #ARGV, 5 do
    local mid = ARGV[i + 2]
    if mid ~= '' then
      if redis.call('ZSCORE', Q.dedup, mid) then
        duplicate[i] = true
        duplicates = duplicates + 1
      else
        redis.call('ZADD', Q.dedup, Q.now, mid)
      end
    end
  end
end
local accepted = (#ARGV - first + 1) / 5 - duplicates
if accepted > 1 then
  Q.nextSeq = redis.call('INCRBY', Q.seq, accepted) - accepted + 1
end
-- This call only adds messages: a session's holder and its place in the session index are
-- looked up once per call (includes/fileMessage.lua, includes/placeMessage.lua).
Q.filed, Q.added, Q.holders = {}, {}, {}
-- A call of several messages makes what they add to each index and the bodies' hash one
-- command per key (includes/addTo.lua), and reads its sessions' holders with one HMGET. It
-- reads nothing it gathers: the hand-over's look at a session's available messages comes
-- before any of that session is filed, and only a redelivery backoff's look at a session's
-- first message (includes/refreshFreeSession.lua) would read one: not gathered with it on.
if accepted > 1 and not Q.bo then
  Q.adds = { keys = {} }
  if sessionQueue then
    local sids, seen = {}, {}
    for i = first, #ARGV, 5 do
      local sid = ARGV[i + 1]
      if sid ~= '' and not seen[sid] then
        seen[sid] = true
        sids[#sids + 1] = sid
      end
    end
    for j = 1, #sids, 500 do
      local part = { unpack(sids, j, math.min(j + 499, #sids)) }
      local got = redis.call('HMGET', Q.sholder, unpack(part))
      for k, sid in ipairs(part) do Q.holders[sid] = got[k] or false end
    end
  end
end

local out = {}
for i = first, #ARGV, 5 do
  if duplicate[i] then
    out[#out + 1] = 0
  else
    local sid = ARGV[i + 1]
    if sid == '' then sid = nil end
    local due = tonumber(ARGV[i + 4])
    local now = not (due and due > Q.now) -- else scheduled (includes/placeMessage.lua)
    local o = now and offerFor(sid)
    if o then
      Q.handOver = { token = o.token or tokenAt(o.tokens, #o.rows + 1),
                     lockedUntil = o.lockedUntil, holder = o.holder }
    end
    out[#out + 1] = enqueueMessage(Q, ARGV[i], sid, tonumber(ARGV[i + 3]), due, sessionQueue)
    if o then
      o.rows[#o.rows + 1] = Q.handOver.row
      o.left = o.left - 1
      Q.handOver = nil
    elseif now and sid and offers[sid] then
      offers[sid].left = 0 -- filed available: nothing after it may overtake it
    end
  end
end
flushAdds(Q)
local handed = 0
for _, o in ipairs(offerList) do handed = handed + #o.rows end
-- The standing offers that took messages: the rows to their holders (the offers stay).
for _, o in ipairs(bookList) do
  if #o.rows > 0 then
    handed = handed + #o.rows
    redis.call(Q.publish, Q.channel .. string.match(o.holder, '^[^:]*'),
      o.holder .. '\n' .. packRows(o.rows))
  end
end
-- a message handed over is sent and received at once: counted once, as 'handed', which
-- lua/countEntity.lua adds to both (one command where a whole send was handed over)
countEvent(Q, Q.q, 'sent', #out - duplicates - handed)
countEvent(Q, Q.q, 'handed', handed)
countEvent(Q, Q.q, 'duplicates', duplicates)
for _, o in ipairs(offerList) do out[#out + 1] = o.rows end
return out
