"""Several answers to one request (OpenAI's `n`, and the legacy `best_of`): one job per answer, admitted together
and followed together.

Each answer is a job of its own (its own seed, its own place in the batch, counted against quotas and the KV budget
as one sequence), told by its spec's `choice` which request it belongs to: the first job's id names the group, and
the worker reads their common prompt once for all of them. They are admitted all or none, in one step
(tasks/lua/admit.lua): a request answered with fewer choices than it asked for would be a silent change of meaning.
"""

from __future__ import annotations

import hashlib
import math
import queue
import threading
from collections.abc import Generator

from tasks.job import Choice, Job, JobSpec, new_job_id
from tasks.logprobs import read_entries
from tasks.store import Store
from web.admission import admit_followed
from web.feed import Feed, Hub
from web.follow import Story

ANOTHER_FAILED = ("choice_failed", "another answer of the same request did not complete")


def seed_of(seed: int | None, index: int) -> int | None:
    """Answer `index`'s seed: the request's own for the first, for each other one a seed derived from it (each
    reproducible, and distinct); none without a seed (the worker then draws one per job)."""
    if seed is None or index == 0:
        return seed
    digest = hashlib.sha256(f"{seed}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # (within SamplingParams' bound, 2**63 - 1)


def specs_of(spec: JobSpec, count: int, ids: list[str]) -> list[JobSpec]:
    """The jobs of a request of `count` answers, whose ids are `ids`: one spec each, told its place."""
    if count == 1:
        return [spec]
    return [
        spec.model_copy(
            update={
                "params": spec.params.model_copy(update={"seed": seed_of(spec.params.seed, i)}),
                "choice": Choice(group=ids[0], index=i, of=count),
            }
        )
        for i in range(count)
    ]


def admit_choices(
    store: Store, hub: Hub, spec: JobSpec, ttl_s: float, count: int, param: str = "n"
) -> tuple[list[Job], list[Feed]]:
    """Admit the request's `count` jobs, all or none in one step, followed (web/admission.py); more than the
    caller may ever have waiting is refused naming `param`, the field that asked for them."""
    ids = [new_job_id() for _ in range(count)]
    return admit_followed(store, hub, list(zip(ids, specs_of(spec, count, ids))), ttl_s, param)


def merged(stories: list[Generator[Story, None, None]]) -> Generator[tuple[int, Story], None, None]:
    """The items of every story as they come, each with its story's place, until each story ended.

    Each story is read on a thread of its own (a greenlet under gevent, as the web runs): each keeps its own job's
    watch lease and pings, as one request's would. When the reader stops early (its client left, an answer failed),
    each thread stops at its story's next item; the caller cancels the jobs, so that comes soon."""
    if len(stories) == 1:  # (no thread for the common case)
        yield from ((0, item) for item in stories[0])
        return
    inbox: queue.Queue[tuple[int, Story | BaseException | None]] = queue.Queue()
    stop = threading.Event()

    def read(index: int, story: Generator[Story, None, None]) -> None:
        try:
            for item in story:
                inbox.put((index, item))
                if stop.is_set():
                    break
        except Exception as exc:  # (raised where it is read)
            inbox.put((index, exc))
        finally:
            story.close()
            inbox.put((index, None))

    for index, story in enumerate(stories):
        threading.Thread(target=read, args=(index, story), name="choice", daemon=True).start()
    try:
        left = len(stories)
        while left:
            index, item = inbox.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        stop.set()


def mean_logprob(job: Job) -> float:
    """A completed answer's mean log probability per token, over the tokens that are text (the end of sequence has
    no entry); an answer of no such token ranks last."""
    entries = read_entries(job.logprobs)
    return sum(e.logprob or 0.0 for e in entries) / len(entries) if entries else -math.inf


def best_of(jobs: list[Job], n: int) -> list[Job]:
    """The legacy completions' `best_of`: of the answers generated (each asked for its log probabilities), the `n`
    with the highest log probability per token, as OpenAI defines it: the mean of their tokens' log probabilities
    (the sampler's distribution, tasks/job.py's SamplingParams). Best first; a tie keeps the order generated."""
    return sorted(jobs, key=mean_logprob, reverse=True)[:n]
