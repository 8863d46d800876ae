"""A requeued job goes on from what its earlier runs generated, never sampling those tokens again.

Its worker died (or stopped, or its batch failed) after it had written some of its answer; the ids of the tokens
behind that text are in Redis beside it (tasks/store Claim.delivered). The next run reads them as prompt after the
job's own prompt, with its sampler's key where the earlier run's was, and its detokenizer and stop strings primed
with them, so it writes only what follows. What a client was sent stays true whatever the arithmetic of a second
prefill gives: recovery never depends on two runs computing bit-identical logits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from tasks.job import SamplingParams
from tasks.store import Delivered
from worker.stops import StopMatcher

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resumption:
    """Where a run starts: its detokenizer and stop matcher, primed with its earlier runs' tokens; the text those
    tokens give that was not written yet (`rest`); why nothing is left to generate, if so (`ended`: "stop" or
    "length"); and where its output starts in Redis (`at`: tokens and UTF-8 bytes)."""

    detokenizer: Any
    stops: StopMatcher
    rest: str = ""
    ended: str | None = None
    at: tuple[int, int] | None = None


def fresh(detokenizer: Any, params: SamplingParams) -> Resumption:
    """A first run: nothing to go on from."""
    return Resumption(detokenizer, StopMatcher(params.stop))


def resume(
    detokenizer: Any, params: SamplingParams, delivered: Delivered, eos: frozenset[int], complete: bool = False
) -> Resumption:
    """A run that goes on from `delivered`, with a fresh `detokenizer` of the job's model and its `eos` ids;
    `complete`: those tokens complete the job's grammar (nothing may follow them)."""
    stops, ids = StopMatcher(params.stop), delivered.ids
    at_eos = bool(ids) and not params.ignore_eos and ids[-1] in eos  # it ended; only its ending was lost
    ended = "stop" if at_eos or complete else "length" if len(ids) >= params.max_tokens else None
    for token in ids[:-1] if at_eos else ids:  # (the EOS token itself is not text)
        detokenizer.add_token(token)
    if ended:
        detokenizer.finalize()
    text, hit = stops.feed(detokenizer.last_segment)
    if hit:  # it ended at a stop string; only its ending was lost
        ended = "stop"
    elif ended:
        text += stops.flush()
    if text.startswith(delivered.text):
        rest = text[len(delivered.text) :]
    else:  # not what these tokens give: keep what was written, never take it back
        logger.warning("a resumed run's tokens do not give the text written of them; going on after it")
        rest = ""
    return Resumption(detokenizer, stops, rest, ended, (len(ids), len(delivered.text.encode())))
