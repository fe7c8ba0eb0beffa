-- Wake up to `n` of the receivers waiting in the zset `waiters` (oldest first), each once, and
-- take them off it: one PUBLISH (Q.publish) to the channel of the process the waiter lives on, carrying the
-- waiter's id. Waiter ids are `<process id>:<link id>`; Q.channel is the channels' common
-- prefix. A woken receiver that finds nothing waits again (registers anew), so a wake-up costs
-- at most one script call of the receiver it reaches, whatever the number of idle receivers.
local function wakeWaiters(Q, waiters, n)
  if n <= 0 then return 0 end
  local popped = redis.call('ZPOPMIN', waiters, n)
  for i = 1, #popped, 2 do
    local id = popped[i]
    if not Q.woken[id] then
      Q.woken[id] = true
      redis.call(Q.publish, Q.channel .. string.match(id, '^[^:]*'), id)
    end
  end
  return #popped / 2
end
