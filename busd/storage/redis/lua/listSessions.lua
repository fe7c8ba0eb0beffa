--[[
  listSessions: a page of session ids. Without a time: every session with messages or state,
  in session id order. With a time: sessions whose state was set after it, oldest update
  first. A held session without messages or state is not listed (includes/unlistedSession.lua).

  Invariant: the order is stable between calls (ids, or update time then id), so pages do
  not overlap while nothing changes.

  Housekeeping first (bounded): expired locks, due scheduled messages, expired messages
  (session-wide), so that listed sessions reflect expiry.

  Context: queue

  Input:
    KEYS, ARGV[1..c]  the queue context (includes/queueContext.lua)
    ARGV[c+1] skip
    ARGV[c+2] top
    ARGV[c+3] updated after ms ('' any)

  Output:
    array of session ids

  Events:
    wake-ups (includes/wakeWaiters.lua) when housekeeping made messages or sessions available
]]
--- @include "queueContext"
--- @include "housekeeping"
--- @include "unlistedSession"

local Q = queueContext(0, 0)
local skip = tonumber(ARGV[QUEUE_ARGC + 1])
local top = tonumber(ARGV[QUEUE_ARGC + 2])
housekeeping(Q, Q.q)
if top <= 0 then return {} end

local after = ARGV[QUEUE_ARGC + 3]
local function range(from, n)
  if after == '' then return redis.call('ZRANGE', Q.sessions, from, from + n - 1) end
  return redis.call('ZRANGEBYSCORE', Q.supdated, '(' .. after, '+inf', 'LIMIT', from, n)
end
-- With no holder, every session in the indexes is listed: the page is one range read.
local held = redis.call('HLEN', Q.sholder)
if held == 0 then return range(skip, top) end

-- Else the unlisted (held, without messages or state) are left out (listing is rare; leaving
-- them in the index spares every held session's message two writes, docs/design.md §3.4).
-- The page starts at the position `from` of the index where `skip` listed sessions lie
-- before it: counted from the index's start when `skip` is small, else from the ranks of
-- the unlisted, which are held sessions; either way O(min(skip, held sessions)).
local from = 0
local toSkip = skip
if skip > held then
  local ranks = {}
  local base = 0
  if after ~= '' then base = redis.call('ZCOUNT', Q.supdated, '-inf', after) end
  for _, sid in ipairs(redis.call('HKEYS', Q.sholder)) do
    if unlistedSession(Q, sid, true) then
      local rank
      if after == '' then
        rank = redis.call('ZRANK', Q.sessions, sid)
      else
        local score = redis.call('ZSCORE', Q.supdated, sid)
        if score and tonumber(score) > tonumber(after) then
          rank = redis.call('ZRANK', Q.supdated, sid) - base
        end
      end
      if rank then ranks[#ranks + 1] = rank end
    end
  end
  table.sort(ranks)
  from = skip
  for _, rank in ipairs(ranks) do
    if rank > from then break end
    from = from + 1
  end
  toSkip = 0
end
local out, listed, chunk = {}, 0, math.max(top, 100)
while #out < top do
  local sids = range(from, chunk)
  for _, sid in ipairs(sids) do
    if not unlistedSession(Q, sid) then
      listed = listed + 1
      if listed > toSkip then
        out[#out + 1] = sid
        if #out == top then break end
      end
    end
  end
  if #sids < chunk then break end
  from = from + chunk
end
return out
