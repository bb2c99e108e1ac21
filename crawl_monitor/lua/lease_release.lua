-- The fast path of releasing the leader's lease (crawl_monitor/store.py).
--
-- KEYS: monitor_leader. ARGV: token. Deletes the lease only if it is the token's.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
