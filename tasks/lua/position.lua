-- Where waiting jobs stand: for each, 1 + the number of jobs that run before it (its rank in the fair order),
-- in O(log n) each. ARGV: id...  ->  {mean service s, left of the running job s, jobs timed, position or false
-- for each id (false: it does not wait)}
local mean, left, _, timed = service_estimate(now())
local out = {tostring(mean), tostring(left), timed}
for i = A + 1, #ARGV do
  local rank = redis.call('ZRANK', QUEUE, ARGV[i])
  out[#out + 1] = rank and rank + 1 or false
end
return out
