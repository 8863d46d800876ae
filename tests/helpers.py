"""Helpers that keep tests short: the REST API as a test reads it, and waits on a job's live feed."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from tasks import keys
from tasks.batches import BatchRecord, BatchStore
from tasks.events import Event
from tasks.job import Job
from tasks.store import Store, Switch
from web.responses import Job as JobBody

BUSY = 1_000_000  # max_tokens of a job that keeps the worker busy until the story cancels it (the tests' limit)


class JobsClient:
    """The REST API as a test reads it."""

    def __init__(self, client) -> None:  # type: ignore[no-untyped-def]
        self.client = client

    def submit(self, prompt: str = "hi", expect: int = 202, **fields: Any) -> dict[str, Any]:
        body = fields if "messages" in fields else {"prompt": prompt, **fields}
        response = self.client.post("/v1/jobs", json=body)
        assert response.status_code == expect, response.get_json()
        return response.get_json()  # type: ignore[no-any-return]

    def get(self, job_id: str) -> dict[str, Any]:
        response = self.client.get(f"/v1/jobs/{job_id}")
        assert response.status_code == 200, response.get_json()
        return response.get_json()  # type: ignore[no-any-return]

    def cancel(self, job_id: str) -> Any:
        return self.client.delete(f"/v1/jobs/{job_id}")


def claim_now(store: Store, worker: str) -> Job | None:
    """Play a worker that has every model loaded and no budget to keep: start the next job in fair order."""
    claim = store.for_worker(worker).claim_next(want="*")
    assert not isinstance(claim, Switch), "every model is loaded"
    return claim.job if claim else None


def wait_ended(store: Store, job_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Wait on the job's live feed (not a sleep loop) until it ends; return the job as clients see it."""
    return wait_event(store, job_id, lambda e: e.terminal, timeout_s)


def wait_event(store: Store, job_id: str, match: Callable[[Event], bool], timeout_s: float = 30.0) -> dict[str, Any]:
    """Wait until an event matching `match` is in the job's log (already there, or arriving live)."""
    with store.redis.pubsub(ignore_subscribe_messages=True) as sub:
        sub.subscribe(keys.channel(job_id))
        if any(match(e) for e in store.events(job_id)):
            return JobBody.of(store.get(job_id))
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            message = sub.get_message(timeout=left)
            if message and match(Event.from_message(message["data"])):
                return JobBody.of(store.get(job_id))
    raise AssertionError(f"job {job_id}: no matching event within {timeout_s} s; events: {store.events(job_id)}")


class EventStream:
    """A real HTTP client of /v1/jobs/<id>/events that parses server-sent events."""

    def __init__(self, base_url: str, job_id: str, last_event_id: int | None = None) -> None:
        import requests

        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        self.response = requests.get(f"{base_url}/v1/jobs/{job_id}/events", headers=headers, stream=True, timeout=30)
        assert self.response.status_code == 200, self.response.text
        assert self.response.headers["Content-Type"].startswith("text/event-stream")
        self._lines = self.response.iter_lines(decode_unicode=True)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Each event as {"event", "id", "data"}; comments as {"comment": text}. Ends when the server ends."""
        fields: dict[str, Any] = {}
        for line in self._lines:
            if line == "":
                if "event" in fields:
                    yield fields
                fields = {}
            elif line.startswith(":"):
                yield {"comment": line[1:].strip()}
            else:
                name, _, value = line.partition(": ")
                if name == "data":
                    fields["data"] = json.loads(value)
                elif name == "id":
                    fields["id"] = int(value)
                elif name == "event":
                    fields["event"] = value

    def close(self) -> None:
        self.response.close()


def openai_chunks(response: Any) -> Iterator[dict[str, Any]]:
    """The JSON chunks of an OpenAI stream (a `requests` response read as it comes); an error chunk fails the test."""
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("data: {"):
            chunk = json.loads(line.removeprefix("data: "))
            assert "error" not in chunk, chunk
            yield chunk


def wait_answering(url: str, process: Any, timeout_s: float = 30.0) -> None:
    """Until GET `url` answers 200, while `process` (a Popen: the server) lives."""
    import requests

    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, f"the server of {url} exited"
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, f"{url} did not answer 200 within {timeout_s:g} s"
        time.sleep(0.1)  # a poll: a process starting up announces nothing to wait on


def wait_batch(
    store: Store, batch_id: str, match: Callable[[BatchRecord], bool] = lambda b: b.ended, timeout_s: float = 60.0
) -> BatchRecord:
    """Wait on the batch's channel (not a sleep loop) until its record matches `match` (default: it ended)."""
    batches = BatchStore(store.redis, store.settings)
    with store.redis.pubsub(ignore_subscribe_messages=True) as sub:
        sub.subscribe(keys.batch_channel(batch_id))
        deadline = time.monotonic() + timeout_s
        while not match(record := batches.get(batch_id)):
            if (left := deadline - time.monotonic()) <= 0:
                raise AssertionError(f"batch {batch_id}: not there within {timeout_s} s: {record}")
            sub.get_message(timeout=left)
    return record


DEMO = "onelane-demo"  # the demo model's name in the default catalog (settings without ONELANE_MODEL)


def sdk(base_url: str, api_key: str = "anything", timeout: float = 30) -> Any:
    """The official openai client of a live server (no retries: a story sees every answer)."""
    import openai

    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=timeout)


def chat_line(
    custom_id: str, text: str | None = None, tokens: int = 4, model: str = DEMO, **body: Any
) -> dict[str, Any]:
    """A Batch API input line: a greedy chat request of `tokens` tokens (the text: the custom_id unless given)."""
    request = {
        "model": model,
        "messages": [{"role": "user", "content": text or custom_id}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        **body,
    }
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": request}


def finished(engine: Any, prompt: str | list[int], max_tokens: int = 4) -> tuple[list[int], Any]:
    """A prompt's tokens, and the KV state (with its tokens) it ended with, `max_tokens` tokens later."""
    from tasks.job import SamplingParams

    tokens = list(engine.tokenizer.encode(prompt)) if isinstance(prompt, str) else list(prompt)
    uid = engine.insert(tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    with engine.lock:
        while True:
            ended = [t.kv for t in engine.step() if t.uid == uid and t.finish_reason]
            if ended:
                return tokens, ended[0]
