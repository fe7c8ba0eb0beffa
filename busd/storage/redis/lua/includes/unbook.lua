-- Session `sid` got an available message: the standing offer its holder left
-- (lua/receiveSessionMessages.lua) ends, so that no send hands a message over past one filed
-- before it (a send then needs no look at the session's available messages). `Q.books`
-- (lua/sendMessages.lua) knows the offers the call read: one known gone is not deleted again.
local function unbook(Q, sid)
  local books = Q.books
  if books and books[sid] == false then return end
  redis.call('HDEL', Q.sbook, sid)
  if books then books[sid] = false end
end
