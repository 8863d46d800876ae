-- Which of `models` may not be loaded now: each one that failed to load and whose retry time has not come. First, a
-- load its worker never finished is found from the model's record: it still says `loading`, and the worker it names
-- holds no device any more (its lease lapsed, or its supervisor freed it). What became of that worker (fate() in
-- common.lua) says whether the load is to blame:
-- - it died (a native crash in mlx_lm.load, say, or the OOM killer), or its keeper found it hung (blocked, using and
--   wanting no CPU: a read that never returns): a death of the load, counted now;
-- - it woke after its lease lapsed (a starved machine held it, or its keeper, past the lease): late, counted never;
-- - neither yet: its name is kept (`lapsed`), and it is counted at the model's next unfinished load unless it woke
--   meanwhile (a worker that never wakes was as good as dead), as housekeep.lua counts a job's lapsed run.
-- A load that killed `max_deaths` workers in a row fails like any model that cannot load: why is recorded, and every
-- job of it that waits fails (model_unavailable) at once (fail_model in common.lua); it is tried again after
-- `retry_s`. Fewer deaths, and the model is tried again by the next worker: one death may be the machine's (a stall
-- the supervisor ended, the OOM killer), not the model's, and it must not fail every job of the model. A load that
-- ends well clears the count (WorkerStore.model_loaded). (A worker stopped in good order finishes its load before it
-- stops: only a death or a lapse leaves a load unfinished.) Housekeeping asks about every served model each round; a
-- worker asks about a model before it loads it, so that a model that killed the workers before it is not loaded
-- again at once.
-- ARG: retry_s, result_ttl_s, max_deaths, *models  ->  {model, verdict, n, ...}: 'died' (its load killed its
--   `max_deaths`-th worker in a row: failed just now; n its waiting jobs failed now), 'failed' (earlier; n 0), or,
--   for a load left unfinished just now, which the next worker tries again: 'retry' (a death counted; n deaths in a
--   row), 'late' (its worker woke: nothing counted; n deaths) or 'lapsed' (not known yet; n deaths)
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
  local key = MODEL .. model
  local m = redis.call('HMGET', key, 'state', 'worker', 'deaths', 'lapsed')
  if m[1] == 'loading' and m[2] and not holds_a_device(m[2]) then
    local deaths, was = tonumber(m[3]) or 0, fate(m[2])
    local died = was == 'died' or was == 'hung'
    if m[4] and m[4] ~= '' and fate(m[4]) ~= 'late' then deaths = deaths + 1 end -- an earlier lapse, never woke
    if died then deaths = deaths + 1 end
    redis.call('HSET', key, 'deaths', deaths, 'lapsed', was == 'lapsed' and m[2] or '')
    if deaths >= max_deaths then
      local n = fail_model(model, DIED, retry, result_ttl, t)
      for _, v in ipairs({model, 'died', n}) do table.insert(out, v) end
    else
      redis.call('HSET', key, 'state', 'unloaded')
      for _, v in ipairs({model, died and 'retry' or was, deaths}) do table.insert(out, v) end
    end
  elseif model_failure(model, t) then
    for _, v in ipairs({model, 'failed', 0}) do table.insert(out, v) end
  end
end
return out
