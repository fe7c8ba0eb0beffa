-- The metatable through which a queue context (includes/queueContext.lua) reads the names of
-- its keys (Q.sholder, Q.q.body, ...), for the n keys KEYS[kb+1 .. kb+n]: the one kept for
-- the same keys by an earlier call, else, given `names` (the context's table of names), one
-- made from them and kept; nil when neither. A queue's names are the same on every call:
-- building them took about 3 µs of the server per call, finding them again compares the
-- call's keys with the kept ones (the same strings: one comparison each). They are kept in
-- `queueKeySets`, a local of the library, which lives as long as the library
-- (docs/design.md §3.4); run as a script (EVAL), for the call only. A context's own fields
-- are its own: writing Q.x never changes the kept names.
local queueKeySets, queueKeySetCount = {}, 0
local function queueKeys(kb, n, names)
  local kept = queueKeySets[KEYS[kb + 4]]
  if kept then
    local keys = kept.keys
    for i = 1, n do
      if keys[i] ~= KEYS[kb + i] then
        kept = nil
        break
      end
    end
    if kept then return kept.meta end
  end
  if not names then return nil end
  local keys = {}
  for i = 1, n do keys[i] = KEYS[kb + i] end
  -- bounded (about 3 KB of the server's Lua memory each): a server with more queues in use
  -- than this builds them again now and then
  if queueKeySetCount >= 1024 then queueKeySets, queueKeySetCount = {}, 0 end
  kept = { keys = keys, meta = { __index = names } }
  queueKeySets[KEYS[kb + 4]] = kept
  queueKeySetCount = queueKeySetCount + 1
  return kept.meta
end
