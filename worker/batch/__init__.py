"""The batch: every generating job goes through it, one step at a time on the device, in one thread.

Its layers, from the job to the device (each file's docstring says more):

- `loop.py`: the loop (`Runner`): claims jobs in fair order, steps the batch, records one outcome per job, as one
  short loop over its parts, each an object that holds its own state and is given `members.py` (`Members`: the
  runs in the batch, the model they run on, and the one way in and out of it): `claiming.py` (the next job
  claimed, the queue's head measured until it fits), `preemption.py` (batch work set aside for interactive work),
  `joining.py` (a claimed job placed), `stepping.py` (a step's tokens turned into text and endings), `leaving.py`
  (a job's end, and a failed step's cause looked for), `pooled.py` (embeddings, rerank and token counts beside
  it). The loop looks at the queue again when it moved, or when a part counted something that may let a job join
  (a run left the batch, a failed step's suspects were let back in, pooled work was answered).
- `runs.py`: a job's bookkeeping while it is in the batch (`Running`): its tokens, text, stops, deadline.
- `engine.py`: one model, loaded (`Engine`): prompts to tokens, sequences in and out, a step's tokens drawn;
  `logprobs.py` (the log probabilities of what it draws, recorded and made entries), `sampling.py` (how a token is
  drawn, and a prompt scored), `dtypes.py` (the load-time dtype policy).
- `forward.py`: the continuous batch of sequences (`ContinuousBatch`): one forward pass a step over mlx-lm's model
  and KV caches; `prefill.py` (`Prefilling`, the part it stands on: where each sequence is, and prompts read in
  bounded chunks beside the decode), `rows.py` (what it keeps of each sequence, and whether a model's caches merge).
- `sharing.py`: how a model's sequences share a forward pass, found as it loads.
"""
