-- Shared by every onelane script: tasks/scripts.py writes, in front of it, the constants (every key name and
-- prefix of tasks/keys.py, and the other facts Python and Lua share) and the script's ARG, its arguments by name.
local TIE = 1048576 -- queue score = place (in token units: queue_score) * TIE + admission counter (mod TIE); a
-- score is exact below 2^53, so tags are for 2^33 token units of service (the virtual time restarts when the queue
-- is idle)
local TOKEN_COST = 4 -- the output weight 'auto' before the model's pace is known (ONELANE_FAIR_OUTPUT_WEIGHT) ...
local TOKEN_COST_LEAST = 1 -- ... and the bounds of what it is measured to be (lease.lua)
local TOKEN_COST_MOST = 100
local PROMPT_STEP = 16 -- a prompt's tokens read are counted in steps of this many (estimate_units, charge_used)
local CHARGE_STEP = 32 -- a running job's generated tokens are charged to its flow in steps of this many (charge_running)

local function in_steps(tokens)
  return math.ceil(tokens / PROMPT_STEP) * PROMPT_STEP
end

local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1e6
end

local function fmt(t)
  return string.format('%.6f', t)
end

-- Give `key` the same remaining life as the job record, so no key outlives its job.
local function same_life(key, id)
  redis.call('EXPIRE', key, math.max(redis.call('TTL', JOB .. id), 1))
end

-- Make `key` live at least `life` seconds (EXPIRE GT treats a key without TTL as infinite).
local function extend(key, life)
  if redis.call('TTL', key) < life then redis.call('EXPIRE', key, life) end
end

-- Append one event to the job's durable log and publish it live with its index in the log.
local function emit(id, event_json)
  local n = redis.call('RPUSH', EV .. id, event_json)
  if n == 1 then same_life(EV .. id, id) end
  redis.call('PUBLISH', CH .. id, '{"i":' .. (n - 1) .. ',"e":' .. event_json .. '}')
  return n - 1
end

local function error_json(type_, message)
  return cjson.encode({type = type_, message = message})
end

-- Counters and histograms behind /metrics (a histogram keeps one field per bucket's upper bound; web/health.py
-- reads this list). Up to 900 s: a job waits at most ONELANE_JOB_TTL (600 s) and runs ONELANE_JOB_TIME_LIMIT (900).
local BUCKETS = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900}

local function stat(field, n)
  redis.call('HINCRBY', STATS, field, n or 1)
  redis.call('EXPIRE', STATS, 2592000)
end

local function observe(name, value)
  local le = '+Inf'
  for _, b in ipairs(BUCKETS) do
    if value <= b then le = tostring(b); break end
  end
  stat('h:' .. name .. ':' .. le)
  redis.call('HINCRBYFLOAT', STATS, 'h:' .. name .. ':sum', value)
end

-- The dashboard's plots: what happened in each minute (by Redis's clock), one hash per minute, kept two hours.
-- Returns the minute's key.
local function per_minute(t, field, n)
  local key = MINUTE .. string.format('%d', math.floor(t / 60))
  redis.call('HINCRBY', key, field, n or 1)
  redis.call('EXPIRE', key, MINUTE_TTL)
  return key
end

local function virtual_time()
  return tonumber(redis.call('GET', VTIME) or '0')
end

-- When nothing waits or runs, everybody starts equal again (as start-time fair queuing does when its server
-- goes idle): the virtual time and the table of next tags start again from nothing (which also keeps the tags
-- far below where a score stops being exact).
local function settle_if_idle()
  if redis.call('ZCARD', QUEUE) > 0 or redis.call('ZCARD', IN_PROGRESS) > 0 then return end
  redis.call('DEL', VTIME, TAGS)
end

-- A waiting job's place in the queue, then admission order: an interactive job's start tag, a batch job's finish
-- tag (start tag + cost), so that batch work yields to the interactive work that is as far along as it.
local function queue_score(tag, class, cost, seq)
  return (tag + (class == 'batch' and cost or 0)) * TIE + seq % TIE
end

-- What a generated token costs the device against a prompt token read, at a full batch, as the model's workers
-- measured it (lease.lua), or TOKEN_COST before they have.
local function token_cost(model)
  return tonumber(redis.call('HGET', MODEL .. model, 'token_cost') or '') or TOKEN_COST
end

-- A flow is what takes turns: a user's interactive jobs, or their batch jobs ("user|batch").
local function flow_of(owner, class)
  if class == 'batch' then return owner .. '|batch' end
  return owner
end

-- Fair order charges a job what it costs the device, in token units (tasks/users.py): its prompt's tokens not read from
-- a prefix cache at the prompt weight, and its generated tokens at the output weight, times its owner's share (1 /
-- weight, and ONELANE_BATCH_COST for batch work). Its prompt's estimate is charged as it is admitted, its answer's as
-- it starts (charge_expected), the tokens it generates beyond that as they come (charge_running), and what it used
-- settled as it ends (charge_used); the estimate of its whole cost places a batch job (queue_score). The estimate, in
-- two parts, prompt and answer: its prompt's tokens as the web counted them (`counted`, 0: not counted; less its
-- history's, when a device's prefix cache holds that, at the model's recent characters per token), else its characters
-- at that pace (4 when none is known), and its answer's tokens: max_tokens if it ignores
-- EOS, else the median length of the model's recent answers, at most max_tokens. A prompt's tokens count in steps of
-- PROMPT_STEP, estimated and used: two jobs that differ by less (two short questions, whose estimates miss their
-- template's tokens) cost the same, and keep their admission order; a long prompt's cost is its length within a few per
-- cent. Returns the prompt's units, the answer's, and the answer's tokens.
local function estimate_units(model, prompt_chars, cached_chars, max_tokens, ignore_eos, w_prompt, w_output, counted)
  local chars, tokens, lengths = 0, 0, {}
  for _, entry in ipairs(redis.call('LRANGE', LENGTHS .. model, 0, -1)) do
    local done, _, how, pc, pt = string.match(entry, '([^,]*),([^,]*),([^,]*),([^,]*),([^,]*)')
    if pt and tonumber(pt) and tonumber(pc) and tonumber(pt) > 0 then
      chars, tokens = chars + tonumber(pc), tokens + tonumber(pt)
    end
    if how and how ~= 'i' and tonumber(done) then lengths[#lengths + 1] = tonumber(done) end
  end
  local per_token = (chars > 0 and tokens > 0) and chars / tokens or 4
  local answer = max_tokens
  if not ignore_eos and #lengths > 0 then
    table.sort(lengths)
    answer = math.min(max_tokens, lengths[math.floor((#lengths + 1) / 2)])
  end
  local prompt = math.max(prompt_chars - cached_chars, 1) / per_token
  if (counted or 0) > 0 then prompt = math.max(counted - cached_chars / per_token, 1) end
  return w_prompt * in_steps(prompt), w_output * answer, answer
end

-- Move the waiting jobs of a flow that stand behind `tag` (admitted after the job of that tag) by `delta`, never
-- below the virtual time: a refund does not put a job ahead of where a job admitted now would stand.
local function move_flow(owner, class, tag, delta)
  local flow, moved, n, floor = flow_of(owner, class), nil, 0, virtual_time()
  local waiting = redis.call('ZRANGE', UQ .. owner, 0, -1, 'WITHSCORES')
  for i = 1, #waiting, 2 do
    local other = waiting[i]
    local o = redis.call('HMGET', JOB .. other, 'class', 'model', 'tag')
    if flow_of(owner, o[1]) == flow and tonumber(o[3]) and tonumber(o[3]) > tag then
      local moved_tag = math.max(tonumber(o[3]) + delta, math.min(floor, tonumber(o[3])))
      local score = tonumber(waiting[i + 1]) + (moved_tag - tonumber(o[3])) * TIE
      redis.call('HSET', JOB .. other, 'tag', moved_tag, 'score', score)
      redis.call('ZADD', QUEUE, 'XX', score, other)
      redis.call('ZADD', UQ .. owner, 'XX', score, other)
      if o[2] then redis.call('ZADD', MQ .. o[2], 'XX', score, other) end
      moved, n = other, n + 1
    end
  end
  -- (no position changed when every waiting job moved alike: one user's alone, as their answers are charged)
  if moved and redis.call('ZCARD', QUEUE) > n then redis.call('PUBLISH', MOVED, moved) end
end

-- A job's price, as admit.lua wrote it: its prompt weight, its output weight, its owner's share. The output weight
-- 'auto' is what a generated token of the job's `model` costs as its workers measured it last (token_cost): a job
-- admitted before the device's pace was known, or while the device ran at another pace, is charged at the pace
-- measured now, as every other job is, so that no flow's tokens are priced lower for having been sent earlier.
local function price_of(price, model)
  local wp, wo, share = string.match(price, '([^,]+),([^,]+),([^,]+)')
  return tonumber(wp), tonumber(wo) or token_cost(model), tonumber(share)
end

-- Whether a job has run: it has a start, or tokens (a job handed back to the queue keeps them, not its start).
local function has_run(started_at, prompt_tokens, completion_tokens)
  return started_at ~= nil or (tonumber(prompt_tokens) or 0) > 0 or (tonumber(completion_tokens) or 0) > 0
end

-- Charge `delta` token units (its share applied) to the flow of a job of `owner` and `class` whose start tag is
-- `tag`: the flow's waiting jobs behind it, and its next tag, move by as much (back, for a refund).
local function charge_flow(owner, class, tag, delta)
  if delta == 0 then return end
  move_flow(owner, class, tag, delta)
  local flow = flow_of(owner, class)
  local next_tag = tonumber(redis.call('ZSCORE', TAGS, flow) or tag) + delta
  if next_tag > virtual_time() then
    redis.call('ZADD', TAGS, next_tag, flow)
  else
    redis.call('ZREM', TAGS, flow)
  end
end

-- A job that ran is charged, as it ends, what it used: the tokens it read and generated, at its price (price_of). The
-- difference from what it was charged before (its prompt's estimate and the tokens charged as they came) moves its
-- flow's waiting jobs, and the flow's next tag, by as much: a flow whose answers ran long waits longer for its next
-- turn, one whose ran short or that read its prompt from a cache, less. A job that never ran is never charged: drop()
-- refunds its estimate. (A job that ran, went back to the queue and ends there has no start any more, but its tokens
-- tell that it ran.)
local function charge_used(id)
  local jkey = JOB .. id
  local f = redis.call('HMGET', jkey, 'owner', 'class', 'tag', 'cost', 'price', 'prompt_tokens', 'cached_tokens',
    'completion_tokens', 'started_at', 'model')
  if not (f[1] and f[3] and f[4] and f[5] and has_run(f[9] or nil, f[6], f[8])) then return end
  local wp, wo, share = price_of(f[5], f[10])
  local read = in_steps(math.max((tonumber(f[6]) or 0) - (tonumber(f[7]) or 0), 0))
  local units = wp * read + wo * (tonumber(f[8]) or 0)
  local used = math.floor(units * share + 0.5)
  local delta = used - tonumber(f[4])
  redis.call('HSET', jkey, 'cost', used)
  redis.call('ZINCRBY', SERVICE, math.floor(units + 0.5), flow_of(f[1], f[2]))
  local served = redis.call('ZCARD', SERVICE)
  if served > SERVICE_KEPT then redis.call('ZREMRANGEBYRANK', SERVICE, 0, served - SERVICE_KEPT - 1) end
  redis.call('EXPIRE', SERVICE, SERVICE_TTL)
  charge_flow(f[1], f[2], tonumber(f[3]), delta)
end

-- Charge a job's answer up to `upto` tokens, when that is at least `least` more than it was charged of it
-- (`charged_tokens`), at its price (price_of); 'expect' reads `upto` from the job: its answer's estimate (admit.lua).
local function charge_answer(id, upto, least)
  local jkey = JOB .. id
  local f = redis.call('HMGET', jkey, 'owner', 'class', 'tag', 'cost', 'price', 'charged_tokens', 'model', 'expect')
  local charged = tonumber(f[6]) or 0
  if upto == 'expect' then upto = tonumber(f[8]) or 0 end
  if not (f[1] and f[3] and f[4] and f[5]) or upto - charged < least then return end
  local _, wo, share = price_of(f[5], f[7])
  local delta = math.floor(wo * (upto - charged) * share + 0.5)
  redis.call('HSET', jkey, 'cost', tonumber(f[4]) + delta, 'charged_tokens', upto)
  charge_flow(f[1], f[2], tonumber(f[3]), delta)
end

-- A running job's generated tokens beyond what it was charged of them as it started (its answer's estimate:
-- charge_expected) are charged as they come, CHARGE_STEP at a time: an answer that runs longer than expected is paid
-- for as it is served. `generated`: its completion tokens now (a run after a requeue goes on counting).
local function charge_running(id, generated)
  charge_answer(id, generated, CHARGE_STEP)
end

-- A job that starts is charged its answer's estimate (its `expect`ed tokens, admit.lua), less what it was charged of
-- it before (a job that goes back to the queue is not charged again as it starts again): a flow whose jobs run long
-- answers waits for them from their start, not only as they come, so that it cannot start several jobs' worth ahead
-- of the others while their answers are still to come. What it generates beyond the estimate is charged as it comes
-- (charge_running), and what it used settled as it ends (charge_used): a job that ends early is refunded the rest.
local function charge_expected(id)
  charge_answer(id, 'expect', 1)
end

-- End a job. Every key of an ended job lives for result_ttl seconds from now. The terminal event carries the
-- finish reason and token counts, so that a stream can close without reading the job back.
local function finish(id, status, finish_reason, error_json_, result_ttl, t)
  local jkey = JOB .. id
  stat('finished:' .. status)
  per_minute(t, 'ended:' .. status)
  if status == 'failed' or status == 'expired' then -- the dashboard's recent failures
    redis.call('LPUSH', FAILURES, id)
    redis.call('LTRIM', FAILURES, 0, FAILURES_KEPT - 1)
    redis.call('EXPIRE', FAILURES, result_ttl)
  end
  redis.call('ZREM', IN_PROGRESS, id)
  charge_used(id)
  redis.call('HSET', jkey, 'status', status, 'finished_at', fmt(t))
  if finish_reason ~= '' then redis.call('HSET', jkey, 'finish_reason', finish_reason) end
  if error_json_ ~= '' then redis.call('HSET', jkey, 'error', error_json_) end
  local n = redis.call('HMGET', jkey, 'prompt_tokens', 'completion_tokens', 'cached_tokens', 'stop_sequence')
  emit(id, cjson.encode({type = status, finish_reason = finish_reason ~= '' and finish_reason or nil,
    prompt_tokens = tonumber(n[1]) or 0, completion_tokens = tonumber(n[2]) or 0, cached_tokens = tonumber(n[3]) or 0,
    stop_sequence = n[4] or nil}))
  for _, k in ipairs({jkey, OUT .. id, LP .. id, EV .. id}) do redis.call('EXPIRE', k, result_ttl) end
  redis.call('DEL', TOK .. id) -- no run follows
  images_end(id, status, t) -- its images go, unless a live job or a follow-up needs them (images.lua)
  settle_if_idle()
end

-- What ETAs are forecast from (tasks/eta.py), as JSON, read in one go: the live devices (their slots, the model
-- their batch runs, the models they hold, their measured pace), the running jobs, the first `upto` waiting jobs in
-- fair order, what is known of each of their models (measured pace, last load time, how long a load going on has run,
-- the lengths of recent answers),
-- and the head that jobs of a ready model are passing over (claim.lua), since when. For preemption (claim.lua's
-- first_interactive, worker/runner/preemption.py): a batch-class job (running or waiting) says `batch` and, once set aside,
-- its `preemptions`; a waiting job that may take a batch-class job's slot says nothing, one that may not (a batch,
-- side or solo job) `interactive = false` (each written only when so: the common case costs no bytes).
local function eta_snapshot(t, upto)
  local devices, running, waiting, models = {}, {}, {}, {}
  local function know(model)
    if model and not models[model] then
      local m = redis.call('HMGET', MODEL .. model, 'pace', 'load_s', 'batching', 'state', 'loading_at')
      models[model] = {pace = m[1] or '', load_s = tonumber(m[2] or '') or 0, batching = m[3] or '',
        lengths = redis.call('LRANGE', LENGTHS .. model, 0, -1)}
      if m[4] == 'loading' and tonumber(m[5] or '') then models[model].loading_s = t - tonumber(m[5]) end
    end
  end
  local function num(x) return tonumber(x or '') or 0 end
  for _, device in ipairs(redis.call('SMEMBERS', DEVICES)) do
    local d = redis.call('HMGET', DEVICE .. device, 'worker', 'slots', 'active', 'models', 'pace')
    if d[1] then
      devices[#devices + 1] = {name = device, slots = num(d[2]), active = d[3] or '', models = d[4] or '',
        pace = d[5] or ''}
    end
  end
  for _, id in ipairs(redis.call('ZRANGE', IN_PROGRESS, 0, -1)) do
    local f = redis.call('HMGET', JOB .. id, 'model', 'device', 'max_tokens', 'completion_tokens', 'prompt_tokens',
      'cached_tokens', 'started_at', 'ignore_eos', 'prompt_chars', 'first_token_at', 'class', 'preemptions')
    know(f[1])
    running[#running + 1] = {model = f[1] or '', device = f[2] or '', max_tokens = num(f[3]), done = num(f[4]),
      prompt_tokens = num(f[5]), cached_tokens = num(f[6]), age = t - (tonumber(f[7] or '') or t),
      ignore_eos = f[8] == '1', prompt_chars = num(f[9]), generating_s = t - (tonumber(f[10] or '') or t),
      batch = f[11] == 'batch' or nil, preemptions = num(f[12]) > 0 and num(f[12]) or nil}
  end
  for _, id in ipairs(upto > 0 and redis.call('ZRANGE', QUEUE, 0, upto - 1) or {}) do
    local f = redis.call('HMGET', JOB .. id, 'model', 'max_tokens', 'completion_tokens', 'ignore_eos', 'prompt_chars',
      'history_chars', 'history', 'class', 'preemptions', 'side', 'solo', 'counted')
    know(f[1])
    local hit = f[7] and redis.call('EXISTS', AFFINITY .. f[7]) == 1 -- a device's prefix cache holds its history
    local w = {id = id, model = f[1] or '', max_tokens = num(f[2]), done = num(f[3]),
      ignore_eos = f[4] == '1', prompt_chars = num(f[5]), cached_chars = hit and num(f[6]) or 0}
    if f[8] == 'batch' or f[10] == '1' or f[11] == '1' then w.interactive = false end
    if f[8] == 'batch' then w.batch = true end
    if num(f[9]) > 0 then w.preemptions = num(f[9]) end
    if num(f[12]) > 0 then w.prompt_tokens = num(f[12]) end -- counted at admission
    waiting[#waiting + 1] = w
  end
  local b = redis.call('HMGET', BLOCKED, 'id', 'since')
  return cjson.encode({devices = devices, running = running, waiting = waiting, models = models,
    blocked = b[1] or '', blocked_s = b[2] and t - tonumber(b[2]) or 0})
end

-- Put a job in the waiting indexes: the run order (and its owner's and its model's share of it), deadlines, and,
-- for a watched job, its watcher's lease, starting now. Each index lives at least as long as the job (`life` s).
local function enqueue(id, owner, model, score, deadline, watch_s, t, life)
  redis.call('ZADD', QUEUE, score, id)
  redis.call('ZADD', UQ .. owner, score, id)
  redis.call('ZADD', MQ .. model, score, id)
  redis.call('ZADD', WAITING, deadline, id)
  local indexes = {QUEUE, UQ .. owner, MQ .. model, WAITING}
  if watch_s > 0 then
    redis.call('ZADD', WATCHED, t + watch_s, id)
    indexes[5] = WATCHED
  end
  for _, k in ipairs(indexes) do extend(k, life) end
  redis.call('PUBLISH', MOVED, id)
end

-- Take a job out of every waiting index (it starts, or it will never run).
local function dequeue(id, owner, model)
  redis.call('ZREM', QUEUE, id)
  redis.call('ZREM', WAITING, id)
  redis.call('ZREM', WATCHED, id)
  if owner then redis.call('ZREM', UQ .. owner, id) end
  if model then redis.call('ZREM', MQ .. model, id) end
  redis.call('PUBLISH', MOVED, id)
end

-- The start tag of a flow's next job is the finish tag (start tag + cost) of the last of its jobs that still
-- counts: waiting, or running. A job that left without running (cancelled, expired, its client gone) thus costs its
-- flow no future turn. A flow is kept only while that tag is above the virtual time (where a new flow starts anyway).
local function settle_tag(owner, class)
  local flow, last = flow_of(owner, class), nil
  local waiting = redis.call('ZRANGE', UQ .. owner, 0, -1)
  for i = #waiting, 1, -1 do -- the flow's newest waiting job (the owner's other flow may be in between)
    local f = redis.call('HMGET', JOB .. waiting[i], 'class', 'tag', 'cost')
    if flow_of(owner, f[1]) == flow and tonumber(f[2]) then
      last = tonumber(f[2]) + (tonumber(f[3]) or 0)
      break
    end
  end
  for _, id in ipairs(redis.call('ZRANGE', IN_PROGRESS, 0, -1)) do
    local f = redis.call('HMGET', JOB .. id, 'owner', 'class', 'tag', 'cost')
    if f[1] == owner and flow_of(owner, f[2]) == flow and tonumber(f[3]) then
      last = math.max(last or 0, tonumber(f[3]) + (tonumber(f[4]) or 0))
    end
  end
  if last and last > virtual_time() then
    redis.call('ZADD', TAGS, last, flow)
  else
    redis.call('ZREM', TAGS, flow)
  end
end

-- End a waiting job that will not run again. One that never ran costs its flow nothing: the flow's jobs behind it
-- move up by what it was charged, and the flow's next tag falls back (settle_tag). One that ran before (it went back
-- to the queue) is charged what it used, as it ends (charge_used, in finish).
local function drop(id, status, finish_reason, error_json_, result_ttl, t)
  local f = redis.call('HMGET', JOB .. id, 'owner', 'model', 'class', 'tag', 'cost', 'prompt_tokens',
    'completion_tokens')
  dequeue(id, f[1], f[2])
  if f[1] and tonumber(f[4]) and tonumber(f[5]) and not has_run(nil, f[6], f[7]) then
    move_flow(f[1], f[3], tonumber(f[4]), -tonumber(f[5]))
  end
  if f[1] then settle_tag(f[1], f[3]) end
  finish(id, status, finish_reason, error_json_, result_ttl, t)
end

-- What became of a worker whose lease ended (its record, WORKER): 'died' (its supervisor saw it die holding the
-- device: drop_lease.lua), 'late' (it renewed after its lease lapsed: lease.lua; a worker that woke was not dead,
-- even if its supervisor reaped it afterwards), 'hung' (its keeper stopped renewing it as hung: no heartbeat, and no
-- thread computed or wanted to: worker/keeper.py), or 'lapsed' (none of these, yet). A worker that names nobody
-- (an older job) died, as it always did.
local function fate(worker)
  if worker == '' then return 'died' end
  local f = redis.call('HMGET', WORKER .. worker, 'dead', 'woke', 'hung')
  return f[2] and 'late' or f[1] and 'died' or f[3] and 'hung' or 'lapsed'
end

-- A model failed to load: record why, and end every job of it that waits `failed` (model_unavailable), at once;
-- admission refuses its new jobs until `retry` s have passed, when the next job of it makes a worker try again.
-- Returns how many jobs it failed.
local function fail_model(model, message, retry, result_ttl, t)
  redis.call('HSET', MODEL .. model, 'state', 'failed', 'error', message, 'retry_at', fmt(t + retry), 'at', fmt(t))
  redis.call('HDEL', MODEL .. model, 'deaths', 'lapsed') -- once it may be tried again, its loads start a new count
  redis.call('EXPIRE', MODEL .. model, MODEL_RECORD_TTL)
  stat('model_load_failures')
  local err, n = error_json('model_unavailable', message), 0
  for _, id in ipairs(redis.call('ZRANGE', MQ .. model, 0, -1)) do
    if redis.call('HGET', JOB .. id, 'status') == 'queued' then
      drop(id, 'failed', '', err, result_ttl, t)
      n = n + 1
    else
      redis.call('ZREM', MQ .. model, id)
    end
  end
  return n
end

-- Why the model's jobs cannot run now: it failed to load, and is not tried again until its retry time. Returns
-- the message and the seconds until the retry, or nil.
local function model_failure(model, t)
  local m = redis.call('HMGET', MODEL .. model, 'state', 'retry_at', 'error')
  if m[1] == 'failed' and tonumber(m[2]) and tonumber(m[2]) > t then return m[3], tonumber(m[2]) - t end
  return nil
end

local EXPIRED = 'the job waited past its deadline and was never started'
local CLIENT_GONE = 'the client left before the job started'

-- Start a waiting job on `worker`: it leaves the queue, and the virtual time moves to its start tag (never
-- back: a requeued job keeps its old tag). A job that goes ahead of the head of the fair order (its model is ready,
-- the head's is not) moves it no further than the head's start tag: else a newcomer would land behind every job
-- of the head's flow that the passing jobs' tags overtook, where in fair order it lands behind one of each flow.
-- (The passing jobs are still their flow's turns: its next tag is past theirs.) Flows whose next tag the virtual
-- time caught up with are forgotten. Returns the job's fields.
local function start(id, worker, device, run_life, t)
  local jkey = JOB .. id
  local f = redis.call('HMGET', jkey, 'owner', 'tag', 'model')
  local tag, head = tonumber(f[2]), redis.call('ZRANGE', QUEUE, 0, 0)[1]
  if head and head ~= id then
    tag = math.min(tag, tonumber(redis.call('HGET', JOB .. head, 'tag')))
  end
  dequeue(id, f[1], f[3])
  local vtime = math.max(virtual_time(), tag)
  redis.call('SET', VTIME, vtime, 'KEEPTTL')
  extend(VTIME, run_life)
  redis.call('ZREMRANGEBYSCORE', TAGS, '-inf', vtime)
  charge_expected(id)
  redis.call('HSET', jkey, 'status', 'in_progress', 'started_at', fmt(t), 'worker', worker, 'device', device)
  local attempt = redis.call('HINCRBY', jkey, 'attempts', 1)
  redis.call('EXPIRE', jkey, run_life)
  redis.call('ZADD', IN_PROGRESS, t, id)
  extend(IN_PROGRESS, run_life)
  redis.call('HSET', DEVICE .. device, 'progress', fmt(t))
  local waited = t - tonumber(redis.call('HGET', jkey, 'queued_at'))
  if attempt == 1 then
    observe('queue_wait', waited)
    local key = per_minute(t, 'started')
    redis.call('HINCRBYFLOAT', key, 'wait_sum', waited)
    if waited > tonumber(redis.call('HGET', key, 'wait_max') or '0') then redis.call('HSET', key, 'wait_max', waited) end
  end
  emit(id, '{"type":"started","queued_s":' .. string.format('%.3f', waited) .. '}')
  return redis.call('HGETALL', jkey)
end

-- A running job whose worker is gone (or could not record its outcome) goes back to the front of the queue
-- with its original score and a `requeued` event; it keeps its output and the ids of the tokens it generated (TOK),
-- and its next run goes on from them rather than sampling them again; a watched job gets a fresh watch lease, as
-- at admission, for its client to renew. After max_attempts it ends failed instead, so a prompt that kills
-- the worker every time is quarantined; but only for a failure it had alone: a job that shared the failed
-- batch with others (`shared`) is not blamed for it, it runs alone from then on (`solo`), where a failure is
-- its own. So a job that breaks every batch it is in fails by itself, and its companions complete. Why
-- 'generation_error' (its batch's step failed) with companions sends it alone at once: such a step fails
-- again. Why 'stopping': its worker is shutting down in good order; that run does not count as an attempt.
-- A job asked to stop just ends.
local function release(id, max_attempts, ttl, result_ttl, why, shared)
  local jkey = JOB .. id
  local f = redis.call('HMGET', jkey, 'status', 'attempts', 'cancel_requested', 'owner', 'score', 'deadline',
    'watched', 'model')
  redis.call('ZREM', IN_PROGRESS, id)
  if f[1] ~= 'in_progress' then return 'ended' end
  local t = now()
  if f[3] then
    finish(id, 'cancelled', 'cancelled', redis.call('HGET', jkey, 'cancel_error') or '', result_ttl, t)
    return 'cancelled'
  end
  local attempts = tonumber(f[2])
  local uncounted = why == 'stopping' or why == 'preempted' -- (its run ended by the worker's choice, not a failure)
  if uncounted then
    attempts = attempts - 1
    redis.call('HSET', jkey, 'attempts', attempts)
  end
  if why == 'preempted' then
    redis.call('HINCRBY', jkey, 'preemptions', 1)
    stat('preempted')
    per_minute(t, 'preempted')
  end
  local solo = shared and (why == 'generation_error' or attempts >= max_attempts)
  if attempts >= max_attempts and not solo and not uncounted then
    local story = why == 'worker_crashed' and 'the worker died while running this job, ' .. attempts .. ' times'
      or 'generation failed while running this job, ' .. attempts .. ' times; the worker logged the error'
    finish(id, 'failed', '', error_json(why, story), result_ttl, t)
    return 'failed'
  end
  local deadline = math.max(tonumber(f[6]), t + ttl)
  local life = math.ceil(deadline - t + result_ttl)
  redis.call('HSET', jkey, 'status', 'queued', 'deadline', fmt(deadline))
  redis.call('HDEL', jkey, 'started_at', 'last_token_at', 'progress_at', 'worker', 'device')
  if solo then redis.call('HSET', jkey, 'solo', '1') end
  for _, k in ipairs({jkey, OUT .. id, LP .. id, TOK .. id, EV .. id}) do redis.call('EXPIRE', k, life) end
  enqueue(id, f[4], f[8], f[5], deadline, tonumber(f[7] or '0') or 0, t, life)
  local kept = tonumber(redis.call('HGET', jkey, 'completion_tokens') or '0') or 0
  emit(id, '{"type":"requeued","attempt":' .. attempts .. ',"completion_tokens":' .. kept .. ',"reason":"' .. why .. '"}')
  stat('requeued')
  return 'requeued'
end

-- A running job is orphaned when the worker that claimed it no longer holds its device.
local function orphaned(id)
  local f = redis.call('HMGET', JOB .. id, 'worker', 'device')
  if not f[1] or not f[2] then return true end
  return redis.call('HGET', DEVICE .. f[2], 'worker') ~= f[1]
end

-- Push a dramatiq message (its queue list, its hash, its id, its payload) as dramatiq's enqueue does, unless
-- one is already pending: a message means "run what waits", so one pending is enough, however many jobs are
-- admitted while no worker consumes.
local function ring(queue, messages, message_id, payload)
  if payload == '' or redis.call('LLEN', queue) > 0 then return 0 end
  redis.call('HSET', messages, message_id, payload)
  redis.call('RPUSH', queue, message_id)
  return 1
end
