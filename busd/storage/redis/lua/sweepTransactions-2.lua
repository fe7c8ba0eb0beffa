--[[
  sweepTransactions: drop the staged state of transactions past their time (their process
  rolled them back, or died before the discharge). Idempotent, safe on every process at once.

  Invariant: a transaction past its time has no staged state after a sweep that reached it;
  commitTransaction refuses a transaction past its time, so dropping it changes no outcome.

  Input:
    KEYS[1]  txns     transaction id -> ms it times out
    KEYS[2]  txops    '<txn id>:n' -> count, '<txn id>:<i>' -> i-th operation
    ARGV[1]  most transactions to drop in this call

  Output:
    the number of transactions dropped

  Events:
    none
]]
--- @include "nowMs"
--- @include "dropStaged"

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', nowMs(), 'LIMIT', 0, tonumber(ARGV[1]))
for _, txn in ipairs(due) do dropStaged(KEYS[1], KEYS[2], txn) end
return #due
