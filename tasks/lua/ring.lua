-- Ring the worker's doorbell: push one dramatiq message unless one is pending (see ring() in common.lua).
-- ARG: message queue key, message hash key, message id, message  ->  1 if pushed
return ring(ARG.bell_queue, ARG.bell_messages, ARG.bell_id, ARG.bell)
