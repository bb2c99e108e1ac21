-- The fast path of PlainRegulatorStore.release (crawl_monitor/store.py): giving the
-- leader's lease up, atomically.
--
-- KEYS: monitor_leader. ARGV: token. Deletes the lease only if it is the token's.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
