-- delete: removes every key of the limiter, for all clients.
--
-- KEYS[1] config hash, KEYS[2] value key, KEYS[3] permits ZSET (OVERALL), KEYS[4] registry
-- KEYS[5..] value key, permits ZSET of each client in ARGV[1..]
-- ARGV[1..] every client id in the registry
--
-- Returns the number of keys removed, or -1 when the registry names a client missing from
-- ARGV: read it again and retry.

if not registry_covered(KEYS[4], 1) then
  return -1
end
return redis.call('DEL', unpack(KEYS))
