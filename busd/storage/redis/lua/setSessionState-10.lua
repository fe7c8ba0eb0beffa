--[[
  setSessionState: set or clear a session's state, for its live holder only, or for an
  operator (no holder: the management API's write, docs/management.md), on a condition
  when one is given. The state keeps the session in existence after all its messages are
  gone; setting it (or clearing it) updates the session's last-updated time, which is the
  state's etag (includes/writeSessionState.lua), so the condition is checked and the write
  made in one step.

  Invariant: only the live holder or an operator writes the state; a write whose condition
  fails changes nothing; a session without messages or state is not listed; one left with
  its state alone and no holder is idle (includes/noteIdleSession.lua).

  Input:
    KEYS[1]  sholder    session id -> holder of its lock
    KEYS[2]  slocks     session id -> ms its lock ends
    KEYS[3]  sstate     session id -> state
    KEYS[4]  supdated   session id -> ms its state was last set (the state's etag)
    KEYS[5]  sessions   sessions with messages or state
    KEYS[6]  q.sall     <sid>\0<seq16>: the sessions' deferred and scheduled messages
    KEYS[7]  sidle      session id -> ms it was found idle (an operator's write may leave a
                        session with only its state and no holder: idle from then)
    KEYS[8]  sactive    session id -> ms of its last activity (dropped with the session)
    KEYS[9]  q.sready   <sid>\0<seq16>: the sessions' available messages
    KEYS[10] q.sinflight <sid>\0<seq16>: the sessions' messages in flight
    ARGV[1]  holder ('' an operator: no lock needed)
    ARGV[2]  session id
    ARGV[3]  '1' set, '0' clear
    ARGV[4]  state (when set)
    ARGV[5]  condition: '' none; 'match' the state exists and its etag is ARGV[6] ('*' any
             etag); 'absent' the session has no state
    ARGV[6]  etag (with 'match')

  Output:
    { 0, etag of the state written (null when cleared) }
    { -2 } SESSION_LOCK_LOST
    { -13, current etag or null } PRECONDITION_FAILED

  Events:
    none
]]
--- @include "nowMs"
--- @include "sessionLockedUntil"
--- @include "sessionStateEtag"
--- @include "writeSessionState"

local Q = { sholder = KEYS[1], slocks = KEYS[2], sstate = KEYS[3], supdated = KEYS[4],
            sessions = KEYS[5], q = { sall = KEYS[6], sready = KEYS[9], sinflight = KEYS[10] },
            sidle = KEYS[7], sactive = KEYS[8],
            now = nowMs() }
local sid = ARGV[2]
if ARGV[1] ~= '' and not sessionLockedUntil(Q, sid, ARGV[1]) then return { -2 } end
local condition = ARGV[5]
if condition ~= '' then
  local etag = sessionStateEtag(Q, sid)
  if condition == 'absent' then
    if etag then return { -13, etag } end
  elseif not etag or (ARGV[6] ~= '*' and ARGV[6] ~= etag) then
    return { -13, etag }
  end
end
local set = ARGV[3] == '1'
local at = writeSessionState(Q, sid, set and ARGV[4])
return { 0, set and string.format('%d', at) or false }
