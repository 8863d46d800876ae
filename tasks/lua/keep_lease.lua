-- Keep a device's lease for the worker that holds it, and only for it: the worker's keeper (worker/keeper.py), a
-- small process apart from the worker's interpreter, runs this every third of the lease while the worker lives, is
-- not stopped, and showed life lately; the worker's heartbeat goes on renewing it with its reports (lease.lua). A
-- lease that is not this worker's any more is never taken back here: what lapsed stays lapsed.
-- ARG: device, worker, lease_ms  ->  'ok', or 'lapsed' (the keeper ends; the heartbeat tells the worker)
local key = DEVICE .. ARG.device
if redis.call('HGET', key, 'worker') ~= ARG.worker then return 'lapsed' end
redis.call('PEXPIRE', key, tonumber(ARG.lease_ms))
return 'ok'
