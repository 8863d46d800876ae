-- Where a waiting job stands: 1 + the number of jobs that run before it (its rank in the fair order), in
-- O(log n). ARGV: id  ->  {position or false, mean service s, left of the running job s, jobs timed}
local id = ARGV[A + 1]
local rank = redis.call('ZRANK', QUEUE, id)
local mean, left, _, timed = service_estimate(now())
if not rank then return {false, tostring(mean), tostring(left), timed} end
return {rank + 1, tostring(mean), tostring(left), timed}
