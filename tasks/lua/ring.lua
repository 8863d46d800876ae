-- Ring the worker's doorbell: push one dramatiq message unless one is pending (see ring() in common.lua).
-- ARGV: message queue key, message hash key, message id, message  ->  1 if pushed
return ring(ARGV[A + 1], ARGV[A + 2], ARGV[A + 3], ARGV[A + 4])
