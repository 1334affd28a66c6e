-- acquire: grants permits if the window has room, else says how long until it will.
--
-- KEYS[1] config hash
-- KEYS[2] value key         (the client's own for PER_CLIENT)
-- KEYS[3] permits ZSET      (the client's own for PER_CLIENT)
-- KEYS[4] clients registry  (PER_CLIENT only)
-- ARGV[1] the request: "<permits> <now in us, or -> <max wait in us, -1: none> <rate type>
--         [<client id>]"
--
-- Returns the reply string described in batch.lua (its header).

local batch = new_batch()
local reply = try_acquire(batch, KEYS[1], KEYS[2], KEYS[3], KEYS[4], match(ARGV[1] or '', '^' .. REQUEST))
close_batch(batch)
return reply
