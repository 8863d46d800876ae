"""The worker's loop: which jobs run on the device, and what their tokens become. Every generating job goes through
it, one step of the continuous batch (worker/batch/) at a time, in one thread.

- `loop.py`: the loop (`Runner`): claims jobs in fair order, steps the batch, records one outcome per job, as one
  short loop over its parts, each an object that holds its own state and is given `members.py` (`Members`: the
  runs in the batch, the model they run on, and the one way in and out of it): `claiming.py` (the next job
  claimed, the queue's head measured until it fits), `preemption.py` (batch work set aside for interactive work),
  `joining.py` (a claimed job placed), `stepping.py` (a step's tokens turned into text and endings), `leaving.py`
  (a job's end, and a failed step's cause looked for), `pooled.py` (embeddings, rerank and token counts beside
  it). The loop looks at the queue again when it moved, or when a part counted something that may let a job join
  (a run left the batch, a failed step's suspects were let back in, pooled work was answered).
- `runs.py`: a job's bookkeeping while it is in the batch (`Running`): its tokens, text, stops, deadline;
  `choices.py`: the requests of several answers, their common prompt read once.
"""
