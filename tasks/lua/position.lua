-- Where waiting jobs stand: for each, 1 + the number of jobs that run before it (its rank in the fair order),
-- in O(log n) each, and what their ETAs are forecast from (eta_snapshot in common.lua), with the waiting jobs up
-- to the last of them (at most `limit`).
-- ARG: limit, id...  ->  {snapshot JSON, then for each id its position, or false (it does not wait)}
local ranks, upto = {}, 0
for _, id in ipairs(ARG.ids) do
  local rank = redis.call('ZRANK', QUEUE, id)
  ranks[#ranks + 1] = rank and rank + 1 or false
  if rank then upto = math.max(upto, rank + 1) end
end
local out = {eta_snapshot(now(), math.min(upto, tonumber(ARG.limit)))}
for _, rank in ipairs(ranks) do out[#out + 1] = rank end
return out
