--[[
  discardTransaction: drop what a transaction staged (rollback; nothing it staged was ever
  applied, so nothing else changes).

  Invariant: afterwards the transaction has no staged state.

  Input:
    KEYS[1]  txns     transaction id -> ms it times out
    KEYS[2]  txops    '<txn id>:n' -> count, '<txn id>:<i>' -> i-th operation
    ARGV[1]  transaction id

  Output:
    the number of operations dropped

  Events:
    none
]]
--- @include "dropStaged"

return dropStaged(KEYS[1], KEYS[2], ARGV[1])
