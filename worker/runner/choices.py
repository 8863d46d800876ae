"""The answers of one request (OpenAI's `n`: jobs of one group, tasks/job.py Choice) read their common prompt once.

The first of a group to join the batch reads the prompt (its `leader`); the others that join meanwhile are held, in
the batch (their slots and KV budget taken) but not in the engine. Once the leader has made its first token, its KV
state of the prompt is copied for each of them, and they join with all but the prompt's last token read: each then
samples on its own. A later one copies it too, while any of the group is in the batch.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from tasks.job import SamplingParams
from worker.prefix_disk import compute_state
from worker.runner.runs import Running


@dataclass
class Held:
    """A run waiting for its group's prompt to be read: what it joins the engine with."""

    run: Running
    prompt: list[int]
    params: SamplingParams


@dataclass
class Group:
    leader: Running | None  # the run reading the prompt; None once read
    prompt: list[int]
    held: list[Held] = field(default_factory=list)
    cache: list[Any] | None = None  # once read: the KV state of the prompt's first len - 1 tokens
    members: set[str] = field(default_factory=set)  # the ids of its jobs in the batch

    def copy(self) -> list[Any] | None:
        return copy.deepcopy(self.cache) if self.cache is not None else None


class Groups:
    """The groups with a run in the batch, by group id."""

    def __init__(self) -> None:
        self._by_id: dict[str, Group] = {}

    def get(self, group_id: str) -> Group | None:
        return self._by_id.get(group_id)

    def lead(self, group_id: str, run: Running, prompt: list[int]) -> Group:
        group = self._by_id[group_id] = Group(run, prompt, members={run.job.id})
        return group

    def join(self, group: Group, run: Running) -> None:
        group.members.add(run.job.id)

    @staticmethod
    def hold(group: Group, held: Held) -> None:
        group.held.append(held)
        group.members.add(held.run.job.id)

    def read(self, uids: set[int]) -> list[Group]:
        """The groups whose leader made its first token in the step that made tokens for `uids`."""
        return [g for g in self._by_id.values() if g.leader is not None and g.leader.uid in uids]

    @staticmethod
    def release(group: Group, cache: list[Any] | None) -> list[Held]:
        """The prompt is read (`cache`: its KV state, None if it could not be had): the held runs go on."""
        if cache is not None:  # made now, not when first read: a lazy slice would keep the batch's buffers alive
            compute_state(cache)
        group.leader, group.cache = None, cache
        held, group.held = group.held, []
        return held

    def leave(self, run: Running) -> list[Held]:
        """`run` left the batch. A leader that leaves before its first token releases its group's held runs
        (returned: they read the prompt on their own); a group with no job left in the batch is forgotten."""
        choice = run.job.spec.choice
        group = self._by_id.get(choice.group) if choice else None
        if choice is None or group is None or run.job.id not in group.members:
            return []
        group.members.discard(run.job.id)
        group.held = [h for h in group.held if h.run is not run]
        released = self.release(group, None) if group.leader is run else []
        if not group.members:
            del self._by_id[choice.group]
        return released

    def clear(self) -> None:
        self._by_id.clear()
