-- The names of a queue's keys (Q.sholder, Q.q.body, ...), read through a queue context's
-- metatable (includes/queueContext.lua), from `base`, the one key a call passes for the
-- context: the prefix its keys share (busd/storage/keys.py context_key), `{<tag>}:` for a
-- queue, `{<tag>}:s:<subscription>:` for a subscription, whose `seq` and `dedup` are its
-- topic's (`{<tag>}:`). Every name the loader expects (busd/storage/keys.py QUEUE_KEYS) is
-- written here once as k('<name>'), or t('<name>') for one shared with the topic; the loader
-- checks both lists against busd/storage/keys.py.
-- Passing one key instead of the 39 names costs the server about 6 µs less per call (it reads,
-- parses and turns into Lua strings each argument), and building the names is paid once per
-- queue: they are kept in `queueKeySets`, a local of the library, which lives as long as the
-- library (docs/design.md §3.4); run as a script (EVAL), for the call only. A context's own
-- fields are its own: writing Q.x never changes the kept names. Every key built here has the
-- base's hash tag, so a Cluster finds them in the slot the call was routed by (the server
-- checks it: the library's shebang).
local queueKeySets, queueKeySetCount = {}, 0
local function queueKeys(base)
  local kept = queueKeySets[base]
  if kept then return kept end
  local tag = string.match(base, '^{[^}]*}:')
  if not tag then error('not a queue context key: ' .. base) end
  local function k(name) return base .. name end
  local function t(name) return tag .. name end
  local names = {
    seq = t('seq'), dedup = t('dedup'), sfree = k('sfree'), sholder = k('sholder'),
    slocks = k('slocks'), sstate = k('sstate'), supdated = k('supdated'),
    sessions = k('sessions'), swaiters = k('swaiters'), procs = k('procs'),
    q = { dlq = false, body = k('q.body'), meta = k('q.meta'), all = k('q.all'),
          ready = k('q.ready'), locked = k('q.locked'), tokens = k('q.tokens'),
          deferred = k('q.deferred'), sall = k('q.sall'), sched = k('q.sched'),
          ttl = k('q.ttl'), sready = k('q.sready'), sinflight = k('q.sinflight'),
          waiters = k('q.waiters'), backoff = k('q.backoff') },
    d = { dlq = true, body = k('d.body'), meta = k('d.meta'), all = k('d.all'),
          ready = k('d.ready'), locked = k('d.locked'), tokens = k('d.tokens'),
          deferred = k('d.deferred'), sall = k('d.sall'), waiters = k('d.waiters') },
    stats = k('stats'), fwd = k('fwd'), sidle = k('sidle'), sactive = k('sactive'),
    sclient = k('sclient'), quiet = k('quiet'), sbook = k('sbook'),
  }
  -- bounded (about 3 KB of the server's Lua memory each): a server with more queues in use
  -- than this builds them again now and then
  if queueKeySetCount >= 1024 then queueKeySets, queueKeySetCount = {}, 0 end
  kept = { __index = names }
  queueKeySets[base] = kept
  queueKeySetCount = queueKeySetCount + 1
  return kept
end
