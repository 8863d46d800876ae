-- Admit a request's jobs (one, or one per answer of `n`), atomically with the bounds: all or none. Nothing is
-- written when the queue (global bound) or the owner's share of it (quota) has no room for them all, or when
-- their model failed to load and is not tried again yet. They share everything but their id and spec.
-- Fair order is start-time fair queuing over flows (a user's interactive jobs; their batch jobs). A job costs its
-- flow what it costs the device, in token units, at the prompt and output weights, times the owner's `share`
-- (1 / weight, and ONELANE_BATCH_COST for batch): its prompt's estimate as it is admitted (estimate_units in
-- common.lua), its answer's estimate as it starts (charge_expected), what it generates beyond that as it comes
-- (charge_running), what it used settled as it ends (charge_used). Its start tag is max(virtual time, its flow's last finish tag), its finish tag its start tag +
-- what it was charged (so the flow's next start tag moves as it is charged), and the queue runs in start-tag
-- order, but for batch jobs, which wait for the finish tag of their whole estimate (admission order on ties). So
-- flows share the device's work in proportion to their weights, FIFO within a flow; a flow's next job waits for
-- the others to catch up with what its last ones cost, its first job for nobody (a user of long jobs is not held
-- back at the start of each busy spell, as a finish-tag order would hold them); batch work gets about
-- 1 / ONELANE_BATCH_COST of it against each interactive flow, and an idle flow earns no credit. The output weight
-- 'auto' is what a generated token cost the device against a prompt token read, at a full batch, as the model's
-- workers measured it last (token_cost in lease.lua), when the job is charged (price_of in common.lua).
-- In local mode the browser visitors of one client address (`visitors`, the key of their set; '' otherwise)
-- share one quota, and at most `max_visitors` of them have jobs waiting (each visitor is a flow of its own): an
-- address minting identities takes no more of the queue than one user and a few turns (see web/auth.py).
-- A watched job gets a lease of `watch_grace_s` (0: not watched) that its client's stream or polling renews.
-- The job's dramatiq message (its doorbell), when given, is pushed here as dramatiq's enqueue would, unless one
-- is pending already: an admitted job always has a message to wake the worker, and a consumer blocked on the
-- queue wakes as this script ends.
-- ARG: owner, ttl_s, result_ttl_s, watch_grace_s, max_queue, max_per_user (0: no bound),
--       max_tokens, message queue key, message hash key, message id, message ('' for no message: one per request),
--       model, class ('interactive' | 'batch'), share, prompt_weight, output_weight, visitors key ('' for none), max_visitors, history (the
--       digest of a chat's messages but the last, '' for none: a device whose prefix cache holds it is preferred),
--       line ('1': a batch's line, admitted once only, and neither counted in its owner's quota nor listed),
--       side ('1': a pooled job, read beside the batch: see claim.lua), ignore_eos ('1' or ''), prompt_chars, history_chars (of the messages but the last),
--       counted (its prompt's tokens as the web counted them, 0: not counted), for its ETA and its charge;
--       images ('digest:size ...': the request's images, size 0 for one resent from the server's record),
--       image_upload (the prefix of the keys the bytes of the others were uploaded under), image_need_s (how long a job may wait and run),
--       image_keep_s (how long a completed job's images are kept for a follow-up), max_user_image_bytes (the bytes
--       of images one owner may hold), max_image_bytes (everyone's);
--       then the jobs: id, spec_json, id, spec_json, ... (a batch's line: one)
-- -> {'exists'} for a batch's line admitted before (nothing is written)
--    or {'ok', queued_at, deadline, what ETAs are forecast from (eta_snapshot in common.lua), position, ...}
--    (each job's position, in order)
--    or {'queue_full' | 'quota_exceeded' | 'address_quota' | 'address_visitors', the position whose start frees
--    room for them all, what ETAs are forecast from, the jobs waiting that count against that bound}
--    or {'model_unavailable', retry_after_s, why}
--    or {'image_gone', digest} (an image resent from the server's record is no longer kept)
--    or {'image_quota' | 'image_full', retry_after_s, the bytes of images the owner (or everyone) holds}
local owner = ARG.owner
local ttl, result_ttl, grace = tonumber(ARG.ttl_s), tonumber(ARG.result_ttl_s), tonumber(ARG.watch_grace_s)
local max_queue, max_per_user, max_tokens = tonumber(ARG.max_queue), tonumber(ARG.max_per_user), ARG.max_tokens
local bell_queue, bell_messages, bell_id, bell = ARG.bell_queue, ARG.bell_messages, ARG.bell_id, ARG.bell
local model, class, share = ARG.model, ARG.class, tonumber(ARG.share)
local visitors, max_visitors, history = ARG.visitors, tonumber(ARG.max_visitors), ARG.history
local line = ARG.line == '1'
local jobs = ARG.jobs
local n = #jobs / 2
local t = now()
local q = UQ .. owner

if line and redis.call('EXISTS', JOB .. jobs[1]) == 1 then return {'exists'} end

local why, retry = model_failure(model, t)
if why then
  stat('rejected:model_unavailable')
  return {'model_unavailable', math.max(1, math.ceil(retry)), why}
end
-- a refusal: room for all n jobs frees when the job at `position` starts; `counted_` wait against the bound
local function refusal(verdict, position, counted_)
  return {verdict, position, eta_snapshot(t, position), counted_}
end
local waiting_all = redis.call('ZCARD', WAITING)
if max_queue > 0 and waiting_all + n > max_queue then
  -- room frees as the next jobs start
  stat('rejected:queue_full')
  return refusal('queue_full', waiting_all + n - max_queue, waiting_all)
end
-- the owner's waiting jobs that count against their quota: a batch's lines do not (the batch bounds them itself)
local function counted(queue)
  local c = 0
  for _, other in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
    if redis.call('HGET', JOB .. other, 'line') ~= '1' then c = c + 1 end
  end
  return c
end
-- where the k-th of a queue's jobs stands in the whole queue (1: next to start)
local function place(queue, k)
  local job = redis.call('ZRANGE', queue, k - 1, k - 1)[1]
  return (job and redis.call('ZRANK', QUEUE, job) or 0) + 1
end

if max_per_user > 0 and redis.call('ZCARD', q) + n > max_per_user then
  local mine = counted(q)
  if mine + n > max_per_user then
    -- room frees when this user's first waiting jobs start
    stat('rejected:quota_exceeded')
    return refusal('quota_exceeded', place(q, mine + n - max_per_user), mine)
  end
end
if visitors ~= '' then
  -- the address's visitors with jobs waiting (the others leave the set); room frees when their first waiting
  -- jobs start (the quota), a visitor's turn when one of them has none left waiting (the bound on visitors)
  local waiting, known, ranks, last = 0, false, {}, math.huge
  for _, v in ipairs(redis.call('SMEMBERS', visitors)) do
    local c = redis.call('ZCARD', UQ .. v)
    if c == 0 then
      redis.call('SREM', visitors, v)
    else
      waiting, known = waiting + c, known or v == owner
      for _, job in ipairs(redis.call('ZRANGE', UQ .. v, 0, -1)) do
        ranks[#ranks + 1] = redis.call('ZRANK', QUEUE, job) or 0
      end
      last = math.min(last, redis.call('ZRANK', QUEUE, redis.call('ZRANGE', UQ .. v, -1, -1)[1]) or 0)
    end
  end
  if max_per_user > 0 and waiting + n > max_per_user then
    table.sort(ranks)
    stat('rejected:quota_exceeded')
    return refusal('address_quota', (ranks[waiting + n - max_per_user] or 0) + 1, waiting)
  elseif not known and redis.call('SCARD', visitors) >= max_visitors then
    stat('rejected:quota_exceeded')
    return refusal('address_visitors', last + 1, waiting)
  end
end

-- The request's images (tasks/store/images.py), each 'digest:size' (size 0: one the conversation resends from the
-- server's record, which must be kept still), the bytes of the others uploaded under `image_upload` .. digest:
-- checked against the owner's bound and everyone's before anything is written (the caller drops the uploads of a
-- refused request)
local pictures = {}
for d, size in string.gmatch(ARG.images, '(%x+):(%d+)') do
  pictures[#pictures + 1] = {d = d, size = tonumber(size), upload = tonumber(size) > 0 and ARG.image_upload .. d}
end
if #pictures > 0 then
  image_prune(owner, t)
  local new_mine, new_all, wanted = 0, 0, {}
  for _, p in ipairs(pictures) do
    local kept = redis.call('STRLEN', IMAGE .. p.d)
    if kept == 0 and (p.size == 0 or redis.call('EXISTS', p.upload) == 0) then return {'image_gone', p.d} end
    if p.size == 0 then p.size = kept end
    if kept == 0 then new_all = new_all + p.size end
    if not image_info(owner, p.d) then new_mine = new_mine + p.size end
    wanted[p.d] = true
  end
  local most_mine, most_all = tonumber(ARG.max_user_image_bytes), tonumber(ARG.max_image_bytes)
  local all = tonumber(redis.call('GET', IMAGE_BYTES)) or 0
  if all + new_all > most_all then -- room frees as the first image kept lapses
    local first = redis.call('ZRANGE', IMAGES, 0, 0, 'WITHSCORES')
    return {'image_full', math.max(1, math.ceil((tonumber(first[2]) or t) - t)), all}
  end
  local mine = tonumber(redis.call('HGET', USER_IMAGE_INFO .. owner, 'bytes')) or 0
  if mine + new_mine > most_mine then
    -- room from the owner's images kept only for a follow-up (no live job holds them), the oldest first
    local spare, freed = {}, 0
    for _, d in ipairs(redis.call('ZRANGE', USER_IMAGES .. owner, 0, -1)) do
      if mine + new_mine - freed <= most_mine then break end
      local size, live = image_info(owner, d)
      if size and live == 0 and not wanted[d] then
        spare[#spare + 1] = d
        freed = freed + size
      end
    end
    if mine + new_mine - freed > most_mine then -- room frees as the owner's first hold lapses
      local first = redis.call('ZRANGE', USER_IMAGES .. owner, 0, 0, 'WITHSCORES')
      return {'image_quota', math.max(1, math.ceil((tonumber(first[2]) or t) - t)), mine}
    end
    for _, d in ipairs(spare) do image_release(owner, d, t) end
  end
end

local deadline = t + ttl
local life = math.ceil(ttl + result_ttl)
local flow = flow_of(owner, class)
local cached_chars = 0
if history ~= '' and redis.call('EXISTS', AFFINITY .. history) == 1 then cached_chars = tonumber(ARG.history_chars) or 0 end
local output_weight = tonumber(ARG.output_weight) or token_cost(model)
local prompt_units, answer_units, expect = estimate_units(model, tonumber(ARG.prompt_chars) or 0, cached_chars,
  tonumber(max_tokens), ARG.ignore_eos == '1', tonumber(ARG.prompt_weight), output_weight, tonumber(ARG.counted))
local cost = math.max(1, math.floor(prompt_units * share + 0.5)) -- charged now: its answer, as it starts
local whole = math.max(1, math.floor((prompt_units + answer_units) * share + 0.5))
local price = ARG.prompt_weight .. ',' .. ARG.output_weight .. ',' .. ARG.share -- (output weight 'auto': price_of)
for i = 1, n do
  local id, spec = jobs[2 * i - 1], jobs[2 * i]
  local jkey = JOB .. id
  local tag = math.max(virtual_time(), tonumber(redis.call('ZSCORE', TAGS, flow) or '0'))
  local score = queue_score(tag, class, whole, redis.call('INCR', SEQ))
  redis.call('HSET', jkey, 'spec', spec, 'owner', owner, 'status', 'queued', 'queued_at', fmt(t),
    'deadline', fmt(deadline), 'attempts', 0, 'prompt_tokens', 0, 'completion_tokens', 0, 'tag', tag,
    'score', score, 'max_tokens', max_tokens, 'model', model, 'class', class, 'cost', cost, 'price', price,
    'expect', expect)
  redis.call('HSET', jkey, 'prompt_chars', ARG.prompt_chars)
  if (tonumber(ARG.counted) or 0) > 0 then redis.call('HSET', jkey, 'counted', ARG.counted) end
  if ARG.ignore_eos == '1' then redis.call('HSET', jkey, 'ignore_eos', '1') end
  if grace > 0 then redis.call('HSET', jkey, 'watched', grace) end
  if history ~= '' then redis.call('HSET', jkey, 'history', history, 'history_chars', ARG.history_chars) end
  if line then redis.call('HSET', jkey, 'line', '1') end
  if ARG.side == '1' then redis.call('HSET', jkey, 'side', '1') end
  redis.call('EXPIRE', jkey, life)
  redis.call('ZADD', TAGS, tag + cost, flow)
  enqueue(id, owner, model, score, deadline, grace, t, life)
  if not line then redis.call('ZADD', UJ .. owner, t, id) end
  stat('admitted')
  per_minute(t, 'admitted')
end
if #pictures > 0 then -- the images, kept while the jobs may wait and run (image_need_s), held by each of them
  local need, digests, held = t + tonumber(ARG.image_need_s), {}, {}
  for _, p in ipairs(pictures) do
    if not held[p.d] then
      held[p.d] = true
      digests[#digests + 1] = p.d
      if p.upload and redis.call('EXISTS', IMAGE .. p.d) == 0 then
        redis.call('RENAME', p.upload, IMAGE .. p.d) -- (its life is set by image_hold)
      elseif p.upload then
        redis.call('DEL', p.upload)
      end
      local _, live, kept = image_info(owner, p.d)
      local until_ = math.max(need, tonumber(redis.call('ZSCORE', USER_IMAGES .. owner, p.d)) or 0)
      image_hold(owner, p.d, p.size, (live or 0) + n, kept or 0, until_, t)
    end
  end
  for i = 1, n do
    redis.call('HSET', JOB .. jobs[2 * i - 1], 'images', table.concat(digests, ' '), 'image_keep', ARG.image_keep_s)
  end
end
if not line then
  redis.call('ZREMRANGEBYRANK', UJ .. owner, 0, -1001) -- a user's listing keeps the newest 1000
end
for _, k in ipairs({UJ .. owner, TAGS, SEQ, VTIME}) do extend(k, life) end
if visitors ~= '' then
  redis.call('SADD', visitors, owner)
  extend(visitors, life)
end
ring(bell_queue, bell_messages, bell_id, bell)
local positions, last = {}, 0
for i = 1, n do
  positions[i] = redis.call('ZRANK', QUEUE, jobs[2 * i - 1]) + 1
  last = math.max(last, positions[i])
end
return {'ok', fmt(t), fmt(deadline), eta_snapshot(t, last), unpack(positions)}
