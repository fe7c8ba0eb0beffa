--[[
  setSessionState: set or clear a session's state, for its live holder only. The state
  keeps the session in existence after all its messages are gone; setting it (or clearing
  it) updates the session's last-updated time.

  Invariant: only the live holder writes the state; a session without messages or state
  is not listed.

  Input:
    KEYS[1]  sholder    session id -> holder of its lock
    KEYS[2]  slocks     session id -> ms its lock ends
    KEYS[3]  sstate     session id -> state
    KEYS[4]  supdated   session id -> ms its state was last set
    KEYS[5]  sessions   sessions with messages or state
    KEYS[6]  q.sall     <sid>\0<seq16> of every message of the queue with a session id
    ARGV[1]  holder
    ARGV[2]  session id
    ARGV[3]  '1' set, '0' clear
    ARGV[4]  state (when set)

  Output:
    0 OK
    -2 SESSION_LOCK_LOST

  Events:
    none
]]
--- @include "nowMs"
--- @include "sessionLockedUntil"
--- @include "writeSessionState"

local Q = { sholder = KEYS[1], slocks = KEYS[2], sstate = KEYS[3], supdated = KEYS[4],
            sessions = KEYS[5], q = { sall = KEYS[6] }, now = nowMs() }
local sid = ARGV[2]
if not sessionLockedUntil(Q, sid, ARGV[1]) then return -2 end
writeSessionState(Q, sid, ARGV[3] == '1' and ARGV[4])
return 0
