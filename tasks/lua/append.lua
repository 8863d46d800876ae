-- Count generated tokens, append their text as one token event (if any), and report whether the job must stop
-- (cancelled, or no longer this worker's: it was presumed dead and the job requeued).
-- A write says where it starts: the run's tokens and output bytes before it (`from_n`, `from_b`). A write whose
-- reply was lost may have gone through, or may still arrive late, even after later ones (each try went on a
-- connection of its own): what is there already is not appended again, and a write that starts beyond what is
-- there (its predecessor has not arrived yet) appends nothing and says so (2): the writer's own retry, sent in
-- order, brings both. So no text is doubled, lost or reordered.
-- With no token (n = 0, during a long prefill), it records that the job is making progress. The tokens are charged
-- to the job's flow as they come (charge_running in common.lua).
-- The ids of the tokens counted go on the job's token record (TOK), in step with its completion tokens: a run after
-- a requeue reads them and goes on from there.
-- ARG: id, text, prompt_tokens, worker_id, from_n, from_b ('' for both: at the end, unchecked), cached_tokens (of
--       the prompt's, read from the prefix cache), ids (the ids of the tokens the text is made of, each followed by
--       ','; their number is the tokens counted)
--   ->  APPENDED_STOP, APPENDED_GO_ON, or APPENDED_GAP if it did not line up (nothing appended)
local id, text, prompt_tokens = ARG.id, ARG.text, ARG.prompt_tokens
local lp, prompt_lp = ARG.lp or '', ARG.prompt_lp or ''
local _, n = string.gsub(ARG.ids, ',', ',')
local from_n, from_b = tonumber(ARG.from_n), tonumber(ARG.from_b)
local jkey = JOB .. id
local f = redis.call('HMGET', jkey, 'status', 'cancel_requested', 'first_token_at', 'worker', 'queued_at', 'device',
  'completion_tokens')
if f[1] ~= 'in_progress' or f[4] ~= ARG.worker then return APPENDED_STOP end
local skip_n, skip_b = 0, 0
if from_n then skip_n, skip_b = (tonumber(f[7]) or 0) - from_n, redis.call('STRLEN', OUT .. id) - from_b end
if skip_n < 0 or skip_b < 0 then return APPENDED_GAP end
n, text = math.max(n - skip_n, 0), string.sub(text, skip_b + 1)
local t = now()
if redis.call('EXISTS', DEVICE .. f[6]) == 1 then -- a lapsed lease is not recreated (without its TTL)
  redis.call('HSET', DEVICE .. f[6], 'progress', fmt(t))
end
redis.call('HSET', jkey, 'prompt_tokens', prompt_tokens, 'cached_tokens', ARG.cached_tokens or 0)
if prompt_lp ~= '' then redis.call('HSET', jkey, 'prompt_logprobs', prompt_lp) end
if n > 0 then
  local ids = ARG.ids
  if skip_n > 0 then -- the first skip_n are there already
    local at = 0
    for _ = 1, skip_n do at = string.find(ids, ',', at + 1, true) or #ids end
    ids = string.sub(ids, at + 1)
  end
  if redis.call('APPEND', TOK .. id, ids) == #ids then same_life(TOK .. id, id) end
  if lp ~= '' then
    if skip_n > 0 then -- likewise
      local at = 0
      for _ = 1, skip_n do at = string.find(lp, '\n', at + 1, true) or #lp end
      lp = string.sub(lp, at + 1)
    end
    if redis.call('APPEND', LP .. id, lp) == #lp then same_life(LP .. id, id) end
  end
  charge_running(id, redis.call('HINCRBY', jkey, 'completion_tokens', n))
  stat('tokens', n)
  redis.call('HSET', jkey, 'last_token_at', fmt(t))
  per_minute(t, 'tokens', n)
  if not f[3] then
    redis.call('HSET', jkey, 'first_token_at', fmt(t))
    observe('time_to_first_token', t - tonumber(f[5]))
  end
elseif skip_n == 0 then
  redis.call('HSET', jkey, 'progress_at', fmt(t))
end
if text ~= '' or lp ~= '' or prompt_lp ~= '' then
  if text ~= '' and redis.call('APPEND', OUT .. id, text) == #text then same_life(OUT .. id, id) end
  emit(id, cjson.encode({type = 'token', text = text, n = n, logprobs = lp ~= '' and lp or nil,
    prompt_logprobs = prompt_lp ~= '' and prompt_lp or nil}))
end
if f[2] then return APPENDED_STOP end
return APPENDED_GO_ON
