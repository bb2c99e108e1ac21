-- The fast path of count_hosts (image_crawler/host_index.py): each source's hosts asked
-- about in the last HOST_ACTIVE_S, by state, one ZCOUNT a state, by Redis' clock.
--
-- ARGV: the host index's key prefix, its band, the active window (s), the number of
-- states, then the sources. Answers JSON {"counts": {source: [count of each state, in
-- band order]}} for the sources whose index is a sorted set with members (the others
-- are left out: a key of another type reads as absent).
local prefix, band, active = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local states = tonumber(ARGV[4])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local counts = {}
for i = 5, #ARGV do
  local key = prefix .. ARGV[i]
  local members = redis.pcall('ZCARD', key)
  if type(members) == 'number' and members > 0 then
    local by_state = {}
    for state = 0, states - 1 do
      local low = state * band + now - active
      by_state[state + 1] = redis.call('ZCOUNT', key, string.format('%.17g', low),
        '(' .. string.format('%.17g', (state + 1) * band))
    end
    counts[ARGV[i]] = by_state
  end
end
return cjson.encode({counts = counts})
