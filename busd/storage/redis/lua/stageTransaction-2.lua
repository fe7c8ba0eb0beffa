--[[
  stageTransaction: keep a batch of a transaction's operations in the store until its
  discharge (commitTransaction applies them, discardTransaction drops them).

  The first operation starts the transaction's clock: it times out `timeout` ms later, and
  the sweep (sweepTransactions) drops what a transaction past its time left behind, e.g. when
  the process that ran it died. Operations are kept in order, as given; nothing else changes.

  Invariant: a transaction holds at most `limit` operations and none after its time; a
  refused call stages nothing.

  Input:
    KEYS[1]  txns     transaction id -> ms it times out
    KEYS[2]  txops    '<txn id>:n' -> count, '<txn id>:<i>' -> i-th operation
    ARGV[1]  transaction id
    ARGV[2]  timeout ms, counted from the first operation
    ARGV[3]  most operations a transaction may hold
    ARGV[4]  '1' when the caller has staged nothing for it before
    ARGV[5]  the number of operations in this call
    ARGV[6..]  per operation: its number of fields k, then k fields: kind, entity, ... (the
              records of lua/commitTransaction.lua)

  Output:
    { the number of operations the transaction holds, ms it times out }; { -11 }
    TRANSACTION_TIMEOUT: past its time (or dropped by the sweep); { -12 } RESOURCE_LIMIT: more
    than `limit` operations

  Events:
    none
]]
--- @include "nowMs"

local txn = ARGV[1]
local now = nowMs()
local due = redis.call('ZSCORE', KEYS[1], txn)
if due then
  if tonumber(due) <= now then return { -11 } end
elseif ARGV[4] ~= '1' then
  return { -11 }
end
local countField = txn .. ':n'
local n = tonumber(redis.call('HGET', KEYS[2], countField) or '0')
if n + tonumber(ARGV[5]) > tonumber(ARGV[3]) then return { -12 } end
if not due then
  due = now + tonumber(ARGV[2])
  redis.call('ZADD', KEYS[1], due, txn)
end
local i = 6
while i <= #ARGV do
  local k = tonumber(ARGV[i])
  n = n + 1
  redis.call('HSET', KEYS[2], txn .. ':' .. n, cmsgpack.pack({ unpack(ARGV, i + 1, i + k) }))
  i = i + 1 + k
end
redis.call('HSET', KEYS[2], countField, n)
return { n, tonumber(due) }
