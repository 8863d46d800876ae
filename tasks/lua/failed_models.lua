-- Which of `models` may not be loaded now: each one that failed to load and whose retry time has not come. First, a
-- model whose worker died while loading it (a load that kills its process: a native crash in mlx_lm.load, say) is
-- found failed like any model that cannot load: its record still says `loading`, and the worker it names holds no
-- device any more (its lease lapsed, or its supervisor freed it). Why is recorded, and every job of it that waits
-- fails (model_unavailable) at once (fail_model in common.lua); it is tried again after `retry_s`. (A worker stopped
-- in good order finishes its load before it stops: only a death leaves a load unfinished.) Housekeeping asks about
-- every served model each round; a worker asks about a model before it loads it, so that a model that killed the
-- worker before it is not loaded again at once.
-- ARG: retry_s, result_ttl_s, *models  ->  {model, 'died' (found just now) or 'failed', jobs failed now, ...}
local retry, result_ttl = tonumber(ARG.retry_s), tonumber(ARG.result_ttl_s)
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
  local verdict, n = 'failed', 0
  if m[1] == 'loading' and m[2] and not holds_a_device(m[2]) then
    verdict, n = 'died', fail_model(model, DIED, retry, result_ttl, t)
  end
  if model_failure(model, t) then
    table.insert(out, model)
    table.insert(out, verdict)
    table.insert(out, n)
  end
end
return out
