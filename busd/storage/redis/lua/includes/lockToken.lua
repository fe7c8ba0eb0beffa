-- A lock token names its message (docs/design.md §3.4): its first 8 bytes are the message's
-- sequence number (big-endian), the other 8 the broker's random bytes (the last one a
-- partitioned entity's partition, busd/storage/partitioned/router.py). So a settlement or renewal
-- finds the message from the token alone, and no token index is kept per lock.
local function lockToken(token, seq)
  return struct.pack('>I8', seq) .. string.sub(token, 9, 16)
end
