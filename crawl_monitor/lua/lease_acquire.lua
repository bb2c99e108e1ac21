-- The fast path of PlainRegulatorStore.acquire (crawl_monitor/store.py): taking the
-- leader's lease, atomically.
--
-- KEYS: monitor_leader. ARGV: token, lease TTL (ms). Takes the lease when nobody holds it;
-- answers the holder afterwards (the token itself when taken, or already held).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return ARGV[1] end
return redis.call('GET', KEYS[1])
