-- The field of `sactive` that holds session `sid`'s holder's connection beside its last
-- activity (includes/noteActivity.lua): a session id has no NUL, so no session's own field
-- is named so. Whoever deletes a session's last activity deletes this field with it.
local function clientField(sid) return sid .. '\0c' end
