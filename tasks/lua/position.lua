-- Where waiting jobs stand: for each, 1 + the number of jobs that run before it (its rank in the fair order),
-- in O(log n) each, the seconds its model takes to load first (0 when a live worker has it loaded), and the
-- estimate their ETAs come from (see service_estimate in common.lua).
-- ARG: slots, id...  ->  {mean service s, jobs timed, n, free s (n of them)..., then for each id its position and
-- load seconds, or false, false (it does not wait)}
local mean, free, timed = service_estimate(now(), tonumber(ARG.slots))
local out = estimate_reply({}, mean, free, timed)
for _, id in ipairs(ARG.ids) do
  local rank = redis.call('ZRANK', QUEUE, id)
  out[#out + 1] = rank and rank + 1 or false
  out[#out + 1] = rank and tostring(load_wait(redis.call('HGET', JOB .. id, 'model') or '')) or false
end
return out
