--[[
  deleteMessages: delete up to `count` messages of an entity (the queue, or its dead-letter
  sub-queue) enqueued before a time, lowest sequence number first, as Service Bus's batch
  delete does: available and deferred messages are eligible; locked messages (and the
  messages of a session another receiver holds, unless the session is named) and scheduled
  ones are not. Optionally one session's messages only.

  Invariant: a message is deleted whole (body, metadata, every index), as a completion
  deletes it; a session left with neither messages nor state ceases to exist. Sequence
  numbers are not reused; the event totals count the deleted messages as purged.

  Housekeeping first (bounded), so that expired messages and locks are gone and due
  scheduled messages count as enqueued.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] entity: 'q' or 'd'
    ARGV[c+2] count: most messages to delete (> 0)
    ARGV[c+3] ms: only messages enqueued before it ('' now)
    ARGV[c+4] session id ('' all)
    ARGV[c+5] scan budget: most messages looked at (eligible or not)

  Output:
    the number of messages deleted

  Events:
    wake-ups (includes/wakeWaiters.lua) when housekeeping made messages or sessions available
]]
--- @include "queueContext"
--- @include "housekeeping"
--- @include "sessionSeqs"
--- @include "readMeta"
--- @include "sessionLockedUntil"
--- @include "deleteMessage"
--- @include "forgetSessionIfEmpty"
--- @include "countEvent"

local PAGE = 256
local Q = queueContext(0, 0)
local E = Q[ARGV[QUEUE_ARGC + 1]]
local count = tonumber(ARGV[QUEUE_ARGC + 2])
local before = tonumber(ARGV[QUEUE_ARGC + 3]) or Q.now
local sid = ARGV[QUEUE_ARGC + 4]
local budget = tonumber(ARGV[QUEUE_ARGC + 5])
housekeeping(Q, E)
Q.emptied = {} -- sessions that may have lost their last message, looked at once at the end

local held = {} -- session id -> whether another receiver holds it (sessions not named)
local function eligible(m)
  if m.st ~= 'a' and m.st ~= 'd' then return false end
  if m.enq >= before then return false end
  if m.ss and sid == '' then
    if held[m.sid] == nil then held[m.sid] = sessionLockedUntil(Q, m.sid, false) ~= false end
    if held[m.sid] then return false end
  end
  return true
end

local deleted, scanned, from = 0, 0, 0
while deleted < count and scanned < budget do
  local seqs
  if sid == '' then
    seqs = redis.call('ZRANGEBYSCORE', E.all, from, '+inf', 'LIMIT', 0, PAGE)
  else
    seqs = sessionSeqs(E, sid, from, PAGE)
  end
  if #seqs == 0 then break end
  for _, s in ipairs(seqs) do
    local seq = tonumber(s)
    from = seq + 1
    scanned = scanned + 1
    local m = readMeta(E, seq)
    if m and eligible(m) then
      deleteMessage(Q, E, seq, m)
      deleted = deleted + 1
    end
    if deleted >= count or scanned >= budget then break end
  end
end
for _, s in ipairs(Q.emptied) do forgetSessionIfEmpty(Q, s) end
countEvent(Q, E, 'purged', deleted)
return deleted
