"""The continuous batch on the device: one model loaded, its sequences advanced together, one forward pass a step,
in the worker's one device thread. What schedules it (which jobs run, and what their tokens become) is
worker/runner/, above it: nothing here imports that.

Its layers, from the model to the device (each file's docstring says more):

- `engine.py`: one model, loaded (`Engine`): prompts to tokens, sequences in and out, a step's tokens drawn;
  `logprobs.py` (the log probabilities of what it draws, recorded and made entries), `sampling.py` (how a token is
  drawn, and a prompt scored), `dtypes.py` (the load-time dtype policy).
- `forward.py`: the continuous batch of sequences (`ContinuousBatch`): one forward pass a step over mlx-lm's model
  and KV caches; `prefill.py` (`Prefilling`, the part it stands on: where each sequence is, and prompts read in
  bounded chunks beside the decode, `chunking.py` their size), `rows.py` (what it keeps of each sequence, and
  whether a model's caches merge), `positions.py` (a vision model's own positions).
- `speculation.py`: several tokens a sequence a step, checked in one pass; `proposers.py` where proposals come
  from: `lookup.py` (the sequence's own prompt and answer) or `drafting.py` (a draft model).
- `sharing.py`: how a model's sequences share a forward pass, found as it loads.
"""
