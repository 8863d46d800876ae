-- Where a waiting job stands: 1 + the number of jobs that will run before it under round-robin.
-- Costs O(users), not O(jobs). ARGV: id, owner  ->  {position or false, running_started_at or false, now}
local id, owner = ARGV[A + 1], ARGV[A + 2]
local rank = redis.call('ZRANK', UQ .. owner, id)
local running = redis.call('HGET', RUNNING, 'started_at')
if not rank then return {false, running, fmt(now())} end
local ahead = rank
local before = true -- users ahead of `owner` in the ring get one more turn than those after it
for _, user in ipairs(redis.call('LRANGE', RING, 0, -1)) do
  if user == owner then
    before = false
  else
    local turns = rank
    if before then turns = rank + 1 end
    ahead = ahead + math.min(redis.call('ZCARD', UQ .. user), turns)
  end
end
return {ahead + 1, running, fmt(now())}
