-- Keep a device's lease for the worker that holds it, and only for it: the worker's keeper (worker/keeper.py), a
-- small process apart from the worker's interpreter, runs this every third of the lease while the worker lives, is
-- not stopped, and showed life lately; the worker's heartbeat goes on renewing it with its reports (lease.lua). A
-- lease that is not this worker's any more is never taken back here: what lapsed stays lapsed. A keeper that stops
-- renewing because its worker hung says so instead (`hung`: why), on the worker's record, where failed_models.lua
-- reads it (fate() in common.lua); a renewal after that clears it (the worker came back to life within its lease).
-- ARG: device, worker, lease_ms, hung ('' to renew)  ->  'ok', 'hung' (recorded), or 'lapsed' (the keeper ends; the
--   heartbeat tells the worker)
local record = WORKER .. ARG.worker
if ARG.hung ~= '' then
  redis.call('HSET', record, 'hung', ARG.hung)
  redis.call('EXPIRE', record, WORKER_RECORD_TTL)
  return 'hung'
end
local key = DEVICE .. ARG.device
if redis.call('HGET', key, 'worker') ~= ARG.worker then return 'lapsed' end
redis.call('HDEL', record, 'hung')
redis.call('PEXPIRE', key, tonumber(ARG.lease_ms))
return 'ok'
