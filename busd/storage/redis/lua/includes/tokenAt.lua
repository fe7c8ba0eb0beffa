-- The i-th lock token of a call: the broker passes a call's tokens as one string of 16-byte
-- tokens (one argument instead of one per message).
local function tokenAt(tokens, i)
  return string.sub(tokens, i * 16 - 15, i * 16)
end
