-- The fast path of _entry_of and is_fresh (worker/politeness/robots.py), for
-- RobotsGuard's first step with a host: its robots.txt entry read, and its lock taken
-- when the entry is not fresh and nobody holds the lock, in one round trip (a new host's;
-- on a long tail of hosts, every image's).
--
-- KEYS: robots:{origin}, robots_lock:{origin}. ARGV: now (Unix s, the guard's clock),
-- our product token, the entry version the guard reads, the lock's value, its life (ms).
-- Answers {entry or false, state}: 0 the entry is fresh (the lock left alone), 1 another
-- worker holds the lock, 2 this call took it.
--
-- Fresh as is_fresh judges _entry_of's entry: of this version (or the one before,
-- without "v"), decided for our token or for none, not yet expired; an entry this cannot
-- read is not fresh. The two can differ only on entries no worker writes (a damaged text:
-- fresh to this, not to the guard; a time written as a string: the other way round), and
-- the guard settles those, taking the lock itself or giving it back
-- (RobotsGuard._shared_entry).
local raw = redis.call('GET', KEYS[1])
local function fresh()
  if not raw then return false end
  local ok, entry = pcall(cjson.decode, raw)
  if not ok or type(entry) ~= 'table' then return false end
  local expires
  if entry['v'] == nil then
    expires = entry['expires_at']
  elseif entry['v'] == tonumber(ARGV[3]) then
    local token = entry['t']
    if token ~= nil and token ~= ARGV[2] then return false end
    expires = entry['e']
  else
    return false
  end
  return type(expires) == 'number' and tonumber(ARGV[1]) < expires
end
if fresh() then return {raw, 0} end
if redis.call('SET', KEYS[2], ARGV[4], 'NX', 'PX', ARGV[5]) then return {raw, 2} end
return {raw, 1}
