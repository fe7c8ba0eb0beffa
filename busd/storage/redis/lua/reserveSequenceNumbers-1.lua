--[[
  reserveSequenceNumbers: take sequence numbers for messages enqueued later under them (a
  message scheduled in a transaction is numbered when scheduled, enqueued at the commit).

  Invariant: no two messages of a queue ever get the same number; a reserved number that is
  never used (rollback) is a gap.

  Input:
    KEYS[1]  seq      last sequence number given out
    ARGV[1]  how many

  Output:
    the last number reserved (the call reserves last - n + 1 .. last)

  Events:
    none
]]
return redis.call('INCRBY', KEYS[1], tonumber(ARGV[1]))
