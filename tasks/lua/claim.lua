-- Claim the next job to run, round-robin across users, FIFO within a user. Only a `queued` job whose
-- deadline has not passed (by Redis's clock) becomes `in_progress`; one past its deadline ends `expired`;
-- a watched job whose client left (its lease lapsed) ends `cancelled` (client_gone); anything else
-- popped (cancelled, vanished) is dropped. Returns the claimed id, or false.
-- ARGV: result_ttl_s, run_life_s
local result_ttl, run_life = tonumber(ARGV[A + 1]), tonumber(ARGV[A + 2])
local t = now()
for _ = 1, 1000 do
  local owner = redis.call('LINDEX', RING, 0)
  if not owner then return false end
  local q = UQ .. owner
  local popped = redis.call('ZPOPMIN', q)
  if #popped == 0 or redis.call('ZCARD', q) == 0 then
    redis.call('LREM', RING, 0, owner)
  else
    redis.call('LMOVE', RING, RING, 'LEFT', 'RIGHT')
  end
  if #popped > 0 then
    local id = popped[1]
    local jkey = JOB .. id
    redis.call('ZREM', WAITING, id)
    redis.call('PUBLISH', MOVED, id)
    local f = redis.call('HMGET', jkey, 'status', 'deadline', 'watched')
    if f[1] == 'queued' then
      if t >= tonumber(f[2]) then
        finish(id, 'expired', '', error_json('expired', 'the job waited past its deadline and was never started'),
          result_ttl, t)
      elseif f[3] == '1' and redis.call('EXISTS', WATCH .. id) == 0 then
        finish(id, 'cancelled', 'cancelled', error_json('client_gone', 'the client left before the job started'),
          result_ttl, t)
      else
        redis.call('HSET', jkey, 'status', 'in_progress', 'started_at', fmt(t))
        redis.call('HINCRBY', jkey, 'attempts', 1)
        redis.call('EXPIRE', jkey, run_life)
        redis.call('HSET', RUNNING, 'id', id, 'started_at', fmt(t))
        redis.call('EXPIRE', RUNNING, run_life)
        emit(id, '{"type":"started"}')
        return id
      end
    end
  end
end
return false
