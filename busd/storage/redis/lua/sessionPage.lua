--[[
  sessionPage: one page of the session inspector (docs/management.md §7): the sessions of one
  sorted index after a cursor, with what an operator needs to know about each. The work is
  one range read of the index (O(log n + page)) and a few reads per session of the page,
  whatever the number of sessions. Reads only.

  Sorts, each an index of its own:
    id       every session with messages or state (`sessions`, whose held sessions without
             either are read past: includes/unlistedSession.lua), by id
    locked   held sessions (`slocks`), the lock ending first first
    waiting  free sessions with available messages (`sfree`), the oldest message first
    updated  sessions whose state was set (`supdated`), the oldest update first

  Invariant: changes nothing (no housekeeping either: a lock past its end shows as none).

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] sort: 'id', 'locked', 'waiting' or 'updated'
    ARGV[c+2] cursor: '' the first page; 'id': the last session id of the previous page;
              else '<score>:<session id>' of it (from `next` below)
    ARGV[c+3] page size
    ARGV[c+4] state preview: at most this many bytes of the state
    ARGV[c+5] how many of a session's first messages to read to tell deferred from
              scheduled ones (those beyond count as deferred)

  Output:
    { next cursor ('' last page), sessions in the index (held ones included),
      { session id, holder or false, locked-until ms or false, client or false,
        state size, state preview or false, active, in flight, deferred, scheduled,
        oldest message enqueued ms or false, last activity ms (0 unknown),
        ms state last set (0 never), its score in the index (false for 'id') }, ... }

  Events:
    none
]]
--- @include "queueContext"
--- @include "sessionRange"
--- @include "memberSeq"
--- @include "sessionMembers"
--- @include "readMeta"
--- @include "unlistedSession"
--- @include "clientField"

local Q = queueContext(0, 0)
local sort = ARGV[QUEUE_ARGC + 1]
local cursor = ARGV[QUEUE_ARGC + 2]
local top = tonumber(ARGV[QUEUE_ARGC + 3])
local previewBytes = tonumber(ARGV[QUEUE_ARGC + 4])
local classifyCap = tonumber(ARGV[QUEUE_ARGC + 5])
local index = ({ id = Q.sessions, locked = Q.slocks, waiting = Q.sfree,
                 updated = Q.supdated })[sort]
if not index then return redis.error_reply('unknown sort ' .. sort) end

-- One range of the index after cursor `cur`, at most n: session ids and their scores.
local function fetch(cur, n)
  local got, gotScores = {}, {}
  if sort == 'id' then
    local from = '-'
    if cur ~= '' then from = '(' .. cur end
    return redis.call('ZRANGEBYLEX', index, from, '+', 'LIMIT', 0, n), gotScores
  end
  local rows
  if cur == '' then
    rows = redis.call('ZRANGE', index, 0, n - 1, 'WITHSCORES')
  else
    local colon = string.find(cur, ':', 1, true)
    local score, after = string.sub(cur, 1, colon - 1), string.sub(cur, colon + 1)
    local rank = redis.call('ZRANK', index, after)
    if rank and redis.call('ZSCORE', index, after) == score then
      rows = redis.call('ZRANGE', index, rank + 1, rank + n, 'WITHSCORES')
    else -- that session left the index: go on after its score
      rows = redis.call('ZRANGEBYSCORE', index, '(' .. score, '+inf', 'WITHSCORES',
        'LIMIT', 0, n)
    end
  end
  for i = 1, #rows, 2 do
    got[#got + 1] = rows[i]
    gotScores[#got] = rows[i + 1]
  end
  return got, gotScores
end

-- A held session without messages or state is in `sessions` (and may be in `supdated`) but
-- not listed (includes/unlistedSession.lua): with holders, those indexes' pages leave them
-- out, reading on until the page is full.
local filter = (sort == 'id' or sort == 'updated') and redis.call('HLEN', Q.sholder) > 0
local sids = {}
local scores = {}
local cur = cursor
while true do
  local got, gotScores = fetch(cur, top)
  for i, sid in ipairs(got) do
    if not (filter and unlistedSession(Q, sid)) then
      sids[#sids + 1] = sid
      scores[#sids] = gotScores[i]
      if #sids == top then break end
    end
  end
  if #sids == top or #got < top or not filter then break end
  cur = got[#got]
  if sort ~= 'id' then cur = gotScores[#got] .. ':' .. cur end
end

local nextCursor = ''
if #sids == top then
  nextCursor = sids[#sids]
  if sort ~= 'id' then nextCursor = scores[#sids] .. ':' .. nextCursor end
end
-- the index's size: held sessions without messages or state count in it (counting them out
-- would read every held session, docs/management.md §7)
local out = { nextCursor, redis.call('ZCARD', index) }
for i, sid in ipairs(sids) do
  local lo, hi = sessionRange(sid)
  local holder = redis.call('HGET', Q.sholder, sid)
  local lockedUntil = false
  if holder then
    local lu = tonumber(redis.call('ZSCORE', Q.slocks, sid))
    if lu and lu > Q.now then lockedUntil = lu else holder = false end
  end
  -- its last activity and its holder's connection (includes/noteActivity.lua), read only while
  -- it is held; '' unknown. A store written before the connection lived there kept it in
  -- `sclient`, read instead when the field is missing.
  local activity = redis.call('HMGET', Q.sactive, sid, clientField(sid))
  local client = holder and activity[2]
  if holder and not client then client = redis.call('HGET', Q.sclient, sid) end
  if client == '' then client = false end
  local stateSize = redis.call('HSTRLEN', Q.sstate, sid)
  local preview = false
  if stateSize > 0 and previewBytes > 0 then
    -- the whole state is read to cut it: only when it is small
    if stateSize <= 65536 then
      preview = string.sub(redis.call('HGET', Q.sstate, sid), 1, previewBytes)
    end
  end
  -- available in sready, in flight in sinflight, deferred and scheduled in sall
  -- (includes/fileMessage.lua; one written by a store before that layout is in sall too)
  local rest = redis.call('ZLEXCOUNT', Q.q.sall, lo, hi)
  local active = redis.call('ZLEXCOUNT', Q.q.sready, lo, hi)
  local inflight = redis.call('ZLEXCOUNT', Q.q.sinflight, lo, hi)
  local deferred, scheduled = 0, 0
  local oldest = false
  local first = sessionMembers(Q.q, sid, nil, 1)[1]
  if first then
    local m = readMeta(Q.q, memberSeq(first))
    if m then oldest = m.enq end
  end
  if rest > 0 then
    -- deferred and scheduled messages have no per-session index: tell them apart by the
    -- metadata of the session's first `classifyCap` messages (the rest count as deferred)
    for _, member in ipairs(redis.call('ZRANGEBYLEX', Q.q.sall, lo, hi, 'LIMIT', 0,
        classifyCap)) do
      local m = readMeta(Q.q, memberSeq(member))
      if m and m.st == 's' then
        scheduled = scheduled + 1
      elseif m and m.st ~= 'd' then
        rest = rest - 1 -- written before: counted available or in flight above
      end
    end
    deferred = rest - scheduled
  end
  out[#out + 1] = {
    sid, holder or false, lockedUntil, client or false, stateSize, preview, active, inflight,
    deferred, scheduled, oldest, tonumber(activity[1]) or 0,
    tonumber(redis.call('ZSCORE', Q.supdated, sid)) or 0, scores[i] or false,
  }
end
return out
