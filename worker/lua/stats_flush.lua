-- The fast path of flush_commands (worker/stats.py), for RedisStats' flush: the writes
-- of recording each queued outcome one command at a time (windows, last-N lists,
-- counters), grouped by key, in one call.
--
-- ARGV: a JSON batch {"w": [[window key, trim score, [score, member, ...]], ...], "z":
-- [[hosts key, trim score, [score, host, ...]], ...], "l": [[last-N key, [status, ...]],
-- ...], "c": {counter key: increment}, "r": [set key, [member, ...]] (the per-status
-- error counters, SADDed to their index), "h": [[hash key, {field: increment}], ...]}, then
-- N, the most hosts a hosts key keeps, and its expiry (s). Each window and hosts key is
-- trimmed before its ZADD, a hosts key then cut to its newest members and given its
-- expiry; each list trimmed after its RPUSH. Scores travel as the strings Python prints
-- (repr: exact).
local batch = cjson.decode(ARGV[1])
local n = tonumber(ARGV[2])
local kept, ttl = tonumber(ARGV[3]), ARGV[4]
-- At most 1,000 arguments a call: unpack has a limit (a batch queued while Redis was
-- away can hold thousands of one source's outcomes).
local function chunked(command, key, items)
  for i = 1, #items, 1000 do
    redis.call(command, key, unpack(items, i, math.min(i + 999, #items)))
  end
end
for _, window in ipairs(batch.w) do
  redis.call('ZREMRANGEBYSCORE', window[1], '-inf', window[2])
  chunked('ZADD', window[1], window[3])
end
for _, hosts in ipairs(batch.z) do
  redis.call('ZREMRANGEBYSCORE', hosts[1], '-inf', hosts[2])
  chunked('ZADD', hosts[1], hosts[3])
  redis.call('ZREMRANGEBYRANK', hosts[1], 0, -kept - 1)
  redis.call('EXPIRE', hosts[1], ttl)
end
for _, last in ipairs(batch.l) do
  chunked('RPUSH', last[1], last[2])
  redis.call('LTRIM', last[1], -n, -1)
end
for key, count in pairs(batch.c) do redis.call('INCRBY', key, count) end
chunked('SADD', batch.r[1], batch.r[2])
for _, hash in ipairs(batch.h) do
  for field, count in pairs(hash[2]) do redis.call('HINCRBY', hash[1], field, count) end
end
return 1
