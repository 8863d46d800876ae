-- Which of `models` may not be loaded now: each one that failed to load and whose retry time has not come. First, a
-- model whose worker died while loading it (a load that kills its process: a native crash in mlx_lm.load, say) is
-- found from its record: it still says `loading`, and the worker it names holds no device any more (its lease
-- lapsed, or its supervisor freed it). That death is counted. A load that killed `max_deaths` workers in a row fails
-- like any model that cannot load: why is recorded, and every job of it that waits fails (model_unavailable) at
-- once (fail_model in common.lua); it is tried again after `retry_s`. Fewer deaths, and the model is tried again by
-- the next worker: one death may be the machine's (a stall the supervisor ended, the OOM killer), not the model's,
-- and it must not fail every job of the model. A load that ends well clears the count. (A worker stopped in good
-- order finishes its load before it stops: only a death leaves a load unfinished.) Housekeeping asks about every
-- served model each round; a worker asks about a model before it loads it, so that a model that killed the
-- workers before it is not loaded again at once.
-- ARG: retry_s, result_ttl_s, max_deaths, *models  ->  {model, verdict, n, ...}: 'died' (its load killed its
--   `max_deaths`-th worker in a row: failed just now; n its waiting jobs failed now), 'failed' (earlier; n 0), or
--   'retry' (its load killed a worker just now, fewer than `max_deaths` in a row: the next tries again; n deaths)
local retry, result_ttl, max_deaths = tonumber(ARG.retry_s), tonumber(ARG.result_ttl_s), tonumber(ARG.max_deaths)
local t = now()
local DIED = 'the model failed to load: the worker died while loading it'

local function holds_a_device(worker)
  for _, device in ipairs(redis.call('SMEMBERS', DEVICES)) do
    if redis.call('HGET', DEVICE .. device, 'worker') == worker then return true end
  end
  return false
end

local out = {}
for _, model in ipairs(ARG.models) do
  local m = redis.call('HMGET', MODEL .. model, 'state', 'worker')
  if m[1] == 'loading' and m[2] and not holds_a_device(m[2]) then
    local deaths = redis.call('HINCRBY', MODEL .. model, 'deaths', 1)
    if deaths >= max_deaths then
      local n = fail_model(model, DIED, retry, result_ttl, t)
      for _, v in ipairs({model, 'died', n}) do table.insert(out, v) end
    else
      redis.call('HSET', MODEL .. model, 'state', 'unloaded')
      for _, v in ipairs({model, 'retry', deaths}) do table.insert(out, v) end
    end
  elseif model_failure(model, t) then
    for _, v in ipairs({model, 'failed', 0}) do table.insert(out, v) end
  end
end
return out
