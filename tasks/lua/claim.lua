-- Claim the next job for this worker, atomically. The next job is the head of the fair order, unless its model is
-- not the one the worker's batch runs (or, the batch empty, not loaded): then a job of a model the worker has
-- ready may go ahead of it, but only while the head has waited at most `switch_wait` s longer than it would have
-- (counted from when it was first passed over); after that the worker is told to switch ('switch': let the batch
-- drain; 'load': load the head's model), so the head starts once the batch drains and its model loads.
-- Jobs that must not run are ended on the way, without a token: past its deadline (by Redis's clock) `expired`;
-- watched, with its watcher's lease lapsed, `cancelled` (client_gone); its model failed to load, `failed`
-- (model_unavailable). Only the worker holding the device's lease may claim.
-- A worker with a KV budget must know a job's size before it starts it, so the next job is started only if it is
-- the job the worker names (`want`, which it measured, or '*': any job, as into an empty batch); any other is
-- returned as it is, unclaimed.
-- A chat whose history another live device's prefix cache holds (finish.lua names it), while that device has room
-- in its batch, is left to it for up to `affinity_s` after its admission: this worker takes the next job it may
-- run instead (a job of another owner, as when a head is passed over for its model), or none.
-- A claim is sent again with the same `token` when its answer was lost (a dropped connection, a Redis restart): if
-- it had started a job that still runs here, the answer is that job again, not a second one; else a job started
-- and never answered would stay in progress, run by nobody, for as long as its worker lives.
-- Interactive work does not wait behind batch work: when the worker says it could set a batch-class job aside for
-- it (`urgent`: its batch has no room, and holds a job it may preempt), the first interactive job of the batch's
-- model waiting in time (a bounded look) goes ahead of the batch-class head.
-- ARG: result_ttl_s, run_life_s, device, worker_id, token (this claim's, kept until it is answered), want ('' for
--       none), active (the model the batch runs; '' when the batch is empty), switch_wait_s, affinity_s, urgent
--       ('1' or ''), the models the worker has loaded...
-- -> {'started' | 'next', id, the job's fields as HGETALL gives them, jobs still waiting after it, the ids of the
--    tokens its earlier runs generated (TOK), their text (OUT)},
--    {'switch' | 'load', head id, its model[, 'side': a pooled job's]}, false when nothing waits, or 'lost' without
--    the lease
local result_ttl, run_life, device, worker = tonumber(ARG.result_ttl_s), tonumber(ARG.run_life_s), ARG.device, ARG.worker
local want, active, switch_wait, affinity_s = ARG.want, ARG.active, tonumber(ARG.switch_wait_s), tonumber(ARG.affinity_s)
local loaded = {}
for _, name in ipairs(ARG.loaded) do loaded[name] = true end
if redis.call('HGET', DEVICE .. device, 'worker') ~= worker then return 'lost' end
local t = now()

-- what its earlier runs generated, if it was requeued: the next run goes on from there
local function delivered(id)
  return redis.call('GET', TOK .. id) or '', redis.call('GET', OUT .. id) or ''
end

local last = redis.call('HMGET', DEVICE .. device, 'claim', 'claimed')
if ARG.token ~= '' and last[1] == ARG.token then
  local f = redis.call('HMGET', JOB .. last[2], 'status', 'worker')
  if f[1] == 'in_progress' and f[2] == worker then
    local ids, text = delivered(last[2])
    return {'started', last[2], redis.call('HGETALL', JOB .. last[2]), redis.call('ZCARD', QUEUE), ids, text}
  end
end

-- The first job of `index` (the whole queue, or one model's) that may run, ending those that must not on the way;
-- its id, model and score.
local function first_live(index)
  for _ = 1, 1000 do
    local top = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')
    local id = top[1]
    if not id then return nil end
    local f = redis.call('HMGET', JOB .. id, 'status', 'deadline', 'watched', 'model', 'owner')
    if f[1] ~= 'queued' then
      redis.call('ZREM', index, id) -- a stray entry: the job ended, or its record is gone
      dequeue(id, f[5], f[4])
    elseif t >= tonumber(f[2]) then
      drop(id, 'expired', '', error_json('expired', EXPIRED), result_ttl, t)
    elseif f[3] and tonumber(redis.call('ZSCORE', WATCHED, id) or '0') <= t then
      drop(id, 'cancelled', 'cancelled', error_json('client_gone', CLIENT_GONE), result_ttl, t)
    else
      local why = model_failure(f[4], t)
      if not why then return id, f[4], tonumber(top[2]) end
      drop(id, 'failed', '', error_json('model_unavailable', why), result_ttl, t)
    end
  end
  return nil
end

-- Whether the head may still be passed over: its clock starts the first time it is.
local function may_pass(head)
  local b = redis.call('HMGET', BLOCKED, 'id', 'since')
  if b[1] ~= head then
    redis.call('HSET', BLOCKED, 'id', head, 'since', fmt(t))
    redis.call('EXPIRE', BLOCKED, 86400)
    return switch_wait > 0
  end
  return t - tonumber(b[2]) < switch_wait
end

-- Whether a waiting job is left, for now, to the device whose prefix cache holds its history.
local function elsewhere(id)
  if affinity_s <= 0 then return false end
  local f = redis.call('HMGET', JOB .. id, 'history', 'queued_at')
  if not f[1] or t - tonumber(f[2]) >= affinity_s then return false end
  local there = redis.call('GET', AFFINITY .. f[1])
  if not there or there == device then return false end
  local d = redis.call('HMGET', DEVICE .. there, 'worker', 'batch', 'slots')
  return d[1] ~= false and (tonumber(d[2]) or 0) < (tonumber(d[3]) or 0)
end

-- Whether a waiting job may run now: queued, in time, and its watcher (if it has one) still there.
local function ready(id)
  local f = redis.call('HMGET', JOB .. id, 'status', 'deadline', 'watched')
  return f[1] == 'queued' and t < tonumber(f[2]) and (not f[3] or tonumber(redis.call('ZSCORE', WATCHED, id) or '0') > t)
end

-- The first job among the first LOOK_AHEAD of the fair order that may run now and that `fits` (a bounded look:
-- tasks/scheduling.py).
local function first_ready(fits)
  for _, id in ipairs(redis.call('ZRANGE', QUEUE, 0, LOOK_AHEAD - 1)) do
    if ready(id) and fits(id) then return id end
  end
  return nil
end

-- The first job after `skip` that this worker may run now: of a model it runs, and not left to another device.
local function next_for_me(skip)
  return first_ready(function(id)
    if id == skip then return false end
    local f = redis.call('HMGET', JOB .. id, 'model', 'side')
    local mine = (active ~= '' and f[1] == active) or ((active == '' or f[2] == '1') and loaded[f[1]])
    return mine and not elsewhere(id)
  end)
end

local head, model = first_live(QUEUE)
if not head then return false end
local pick = head
if redis.call('HGET', JOB .. head, 'side') == '1' then
  -- a pooled job (embeddings, rerank) is read beside the batch, whatever model it runs: it needs its model loaded
  -- (the worker loads it without draining the batch), not the batch's model
  if not loaded[model] then return {'load', head, model, 'side'} end
elseif (active ~= '' and model ~= active) or (active == '' and not loaded[model]) then
  pick = nil
  if may_pass(head) then
    if active ~= '' then
      pick = first_live(MQ .. active) -- the batch's model: its next job joins without a switch
    else
      local best -- the loaded model whose next job comes first in the fair order
      for name in pairs(loaded) do
        local id, _, score = first_live(MQ .. name)
        if id and (not best or score < best) then pick, best = id, score end
      end
    end
  end
  if not pick then return {active ~= '' and 'switch' or 'load', head, model} end
end
-- The first interactive job of the batch's model that may run now and may take a batch-class job's slot (not a
-- pooled job, nor one that must run alone).
local function first_interactive()
  return first_ready(function(id)
    local f = redis.call('HMGET', JOB .. id, 'model', 'class', 'side', 'solo')
    return f[1] == active and f[2] ~= 'batch' and f[3] ~= '1' and f[4] ~= '1'
  end)
end

if ARG.urgent ~= '' and active ~= '' and redis.call('HGET', JOB .. pick, 'class') == 'batch' then
  pick = first_interactive() or pick
end
if elsewhere(pick) then
  stat('affinity_passes')
  pick = next_for_me(pick)
  if not pick then return false end
end
if pick == want or want == '*' then
  if pick ~= head then stat('passed_head') end
  local fields = start(pick, worker, device, run_life, t)
  redis.call('HSET', DEVICE .. device, 'claim', ARG.token, 'claimed', pick)
  local ids, text = delivered(pick)
  return {'started', pick, fields, redis.call('ZCARD', QUEUE), ids, text}
end
local ids, text = delivered(pick)
return {'next', pick, redis.call('HGETALL', JOB .. pick), redis.call('ZCARD', QUEUE) - 1, ids, text}
