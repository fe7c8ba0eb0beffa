--- @include "metaField"
--- @include "legacyMeta"
-- A message's metadata, or nil when the entity has no such message. Fields:
--   dc delivery count (earlier failed deliveries)   enq enqueued ms   exp expires ms (nil: never)
--   ttl time to live ms, kept until a scheduled message is activated   sch ms it is due
--   sid session id   ss 1 when filed under its session (session queue, not the DLQ)
--   st state: 'a' available, 'l' locked, 'd' deferred, 's' scheduled, 'x' detached
--   tok lock token   lu locked-until ms (non-session locks; a session message's lock is its
--   session's)   h the holder of the session lock a session message was locked for (nil:
--   not known)   wd 1 when locked out of the deferred state (it goes back there)
--   dlr / dld dead-letter reason / description   pp properties patch (opaque)
--   sst the state of the session dead-lettered with it (lua/deadLetterSession.lua)
--   xs 1 when out of E.sall (includes/fileMessage.lua)   xa 1 when out of E.all: in flight
--   under a session lock (includes/lockMessage.lua)
--   forwarded messages (docs/design.md §3.16): fs the sequence number first given to it, at its
--   original entity   hop how many times it was forwarded   dls the entity whose dead-letter
--   sub-queue it was forwarded from
-- It lives beside the body in the entity's body hash (includes/metaField.lua), or, for a
-- message stored before, in E.meta (includes/legacyMeta.lua).
local function readMeta(E, seq)
  local raw = redis.call('HGET', E.body, metaField(seq)) or legacyMeta(E, seq)
  if not raw then return nil end
  return cmsgpack.unpack(raw)
end
