--- @include "readMeta"
-- The message locked under `token` on entity E: seq, meta; nil when no message is locked
-- under it (its lock was settled, lost or never taken). The token names the message
-- (includes/lockToken.lua); a lock taken before tokens did is found through E.tokens, the
-- index tokens had then, looked at only when the token names no locked message.
local function lockedMessage(E, token)
  if #token == 16 then
    local seq = struct.unpack('>I8', token)
    local m = readMeta(E, seq)
    if m and m.st == 'l' and m.tok == token then return seq, m end
  end
  local seq = redis.call('HGET', E.tokens, token)
  if not seq then return nil end
  seq = tonumber(seq)
  local m = readMeta(E, seq)
  if m and m.st == 'l' and m.tok == token then return seq, m end
  return nil
end
