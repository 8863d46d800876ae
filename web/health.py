"""Health that tells the truth, and Prometheus metrics that are right across processes.

/healthz: this web process answers. /readyz: Redis answers, a worker holds a device with a fresh heartbeat,
its job (if any) is making progress, and the default model is neither loading nor failed to load (a failure holds
until a load replaces it); anyone may ask, so it counts each worker's jobs, never naming them.
/metrics: counters and histograms are recorded in Redis by the Lua scripts at the moment things happen
(admission, claim, first token, end), so web and worker, and several web processes, report the same numbers;
gauges are read at scrape time.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from importlib import resources

from flask import Blueprint, Response, jsonify
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tasks.errors import Unavailable
from tasks.job import JobStatus
from tasks.store import DeviceLease, Reading, Store
from web import responses
from web.apidoc import TEXT, documented, reply
from web.errors import error_response
from web.services import services

bp = Blueprint("health", __name__)

MODEL_STATES = ("loaded", "loading", "failed", "unloaded")
REJECTED = ("queue_full", "quota_exceeded", "model_unavailable")  # admit.lua counts each as rejected:<reason>
HISTOGRAMS = {
    "queue_wait": "Seconds from admission to start, for jobs that started.",
    "time_to_first_token": "Seconds from admission to the first generated token.",
    "job_duration": "Seconds from start to end of a generation.",
}


@bp.get("/healthz")
@documented(
    "healthz", "This web process answers", "health", public=True, answers={200: reply("alive", responses.Health)}
)
def healthz() -> Response:
    return jsonify({"status": "ok"})


@bp.get("/readyz")
@documented(
    "readyz",
    "Ready to generate",
    "health",
    public=True,
    description="Redis answers, a worker holds the device with a fresh heartbeat, its jobs make progress, and the "
    "default model is neither loading nor failed to load (503 names it: `model`); each worker is listed with how many jobs it runs (never which: anyone "
    "may ask), and each model with its state.",
    answers={
        200: reply("ready", responses.Ready),
        503: reply(
            "not ready, and why (or Redis unreachable, with Retry-After)",
            {"oneOf": [responses.NotReady, responses.Error]},
            headers={"Retry-After": False},
        ),
    },
)
def readyz() -> Response:
    svc = services()
    snap = svc.store.readings.snapshot()
    state = {"workers": [_worker(w) for w in snap.workers], "models": [m.__dict__ for m in snap.models]}
    if not snap.workers:
        return _not_ready("no worker holds a device: none is running, or its heartbeat stopped", state)
    stalled = [w for w in snap.workers if w.progress_age_s is not None and w.progress_age_s > svc.settings.stall_s]
    if stalled:
        w = stalled[0]
        return _not_ready(
            f"worker {w.worker} made no progress on its {len(w.jobs)} job(s) for {w.progress_age_s:.0f} s", state
        )
    # another model that loads or failed holds up only its own jobs; the default's, every request that names none
    why = model_unready(snap, svc.settings.model_name)
    if why is not None:
        return _not_ready(why, {"model": svc.settings.model_name, **state})
    return jsonify({"status": "ready", "queue_depth": snap.queue_depth, **state})


def model_unready(snap: Reading, name: str) -> str | None:
    """Why the model `name` cannot take a job at once (it loads, or it failed to load), or None."""
    model = next((m for m in snap.models if m.name == name), None)
    if model is None or model.state not in ("loading", "failed"):
        return None
    if model.state == "loading":
        so_far = f" ({model.loading_s:.0f} s so far)" if model.loading_s is not None else ""
        again = f", its last load failed: {model.error}" if model.error else ""
        return f"the default model {name!r} is loading{so_far}{again}"
    retry = f"tried again in {model.retry_in_s:.0f} s" if model.retry_in_s else "tried again now"
    return f"the default model {name!r} cannot load: {model.error} ({retry})"


def _worker(w: DeviceLease) -> dict[str, object]:
    """A live worker as anyone may see it: its state and how many jobs it runs, never their ids (they are users')."""
    return {
        "device": w.device,
        "worker": w.worker,
        "pid": w.pid,
        "heartbeat_age_s": w.heartbeat_age_s,
        "running": len(w.jobs),
        "progress_age_s": w.progress_age_s,
        "batch": w.batch,
        "slots": w.slots,
        "tokens_per_s": w.tokens_per_s,
        "models": w.models,
        "active": w.active,
        "loading": w.loading,
    }


def _not_ready(reason: str, state: Mapping[str, object]) -> Response:
    """503 with the reason, what the workers and models report, and the model that is the reason (None if none)."""
    response = error_response(503, "unavailable", reason)
    body = response.get_json()
    body.update({"model": None, **state})
    response.set_data(jsonify(body).get_data())
    return response


@bp.get("/metrics")
@documented(
    "metrics",
    "Prometheus metrics",
    "health",
    public=True,
    answers={200: reply("the metrics, in Prometheus' text format", {"type": "string"}, TEXT)},
    errors=[Unavailable],
)
def metrics() -> Response:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(services().store))
    # content_type, not mimetype: CONTENT_TYPE_LATEST names its charset, which mimetype= would add a second time
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


class _Collector:
    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        snap = self.store.readings.snapshot()
        yield from _gauges(snap)
        yield from _counters(snap.stats)
        yield from _service(snap)
        yield from _histograms(snap.stats)


def _gauges(snap: Reading) -> Iterator[Metric]:
    yield GaugeMetricFamily("onelane_queue_depth", "Jobs waiting to run.", value=snap.queue_depth)
    yield GaugeMetricFamily("onelane_jobs_in_progress", "Jobs generating now.", value=snap.in_progress)
    age = GaugeMetricFamily(
        "onelane_worker_heartbeat_age_seconds", "Seconds since each live worker renewed its lease.", labels=["device"]
    )
    for w in snap.workers:
        age.add_metric([w.device], w.heartbeat_age_s)
    yield age
    yield GaugeMetricFamily("onelane_workers_alive", "Workers holding a device lease.", value=len(snap.workers))
    batch: dict[str, tuple[str, Callable[[DeviceLease], float]]] = {
        "batch_size": ("Jobs in the device's batch, as its worker last reported.", lambda w: w.batch),
        "batch_slots": ("The most jobs the device's batch holds (ONELANE_MAX_BATCH).", lambda w: w.slots),
        "batch_occupancy_ratio": (
            "Share of the batch's slots in use (0 to 1).",
            lambda w: w.batch / w.slots if w.slots else 0.0,
        ),
        "prefix_cache_bytes": (
            "Bytes of KV state the device's prefix cache holds (at most ONELANE_PREFIX_CACHE).",
            lambda w: w.cache_bytes,
        ),
        "prefix_cache_entries": ("Entries (token sequences) in the device's prefix cache.", lambda w: w.cache_entries),
    }
    for name, (help_text, value) in batch.items():
        gauge = GaugeMetricFamily(f"onelane_{name}", help_text, labels=["device"])
        for w in snap.workers:
            gauge.add_metric([w.device], value(w))
        yield gauge
    state = GaugeMetricFamily(
        "onelane_model_state",
        "1 for each served model's state (loaded, loading, failed, unloaded).",
        labels=["model", "state"],
    )
    depth = GaugeMetricFamily("onelane_model_queue_depth", "Jobs waiting for each model.", labels=["model"])
    cost = GaugeMetricFamily(
        "onelane_model_token_cost",
        "What a generated token costs the device against a prompt token read, at a full batch, as measured (the fair "
        "order's output weight 'auto'); a model is listed once its pace is known.",
        labels=["model"],
    )
    for m in snap.models:
        for name in MODEL_STATES:
            state.add_metric([m.name, name], 1.0 if m.state == name else 0.0)
        depth.add_metric([m.name], m.queue_depth)
        if m.token_cost is not None:
            cost.add_metric([m.name], m.token_cost)
    yield state
    yield depth
    yield cost


#: The plain counters /metrics exposes: name -> (help, the keys.STATS field the scripts or Upkeep.count add to).
COUNTERS = {
    "jobs_admitted": ("Jobs admitted into the queue.", "admitted"),
    "tokens_generated": ("Tokens generated.", "tokens"),
    "jobs_requeued": (
        "Jobs put back in the queue before they ended (their worker died or stopped, or preempted).",
        "requeued",
    ),
    "jobs_preempted": (
        "Batch-class jobs set aside for interactive work (resumed later, not counted as attempts).",
        "preempted",
    ),
    "worker_restarts": ("Worker processes restarted.", "worker_restarts"),
    "batch_steps": ("Steps of the batch (one token for every generating job).", "batch_steps"),
    "decode_seconds": ("Seconds spent in decode steps.", "decode_seconds"),
    "prefill_seconds": ("Seconds spent prefilling prompts.", "prefill_seconds"),
    "prefill_tokens": ("Prompt tokens prefilled.", "prefill_tokens"),
    "prefix_cache_lookups": ("Prompts looked up in the prefix cache as their job joined the batch.", "cache_lookups"),
    "prefix_cache_hits": ("Lookups that found a cached prefix of the prompt.", "cache_hits"),
    "prefix_cache_tokens": ("Prompt tokens read from the prefix cache instead of prefilled.", "cache_tokens"),
    "prefix_cache_disk_hits": (
        "Prefix-cache hits read from its disk tier (after a restart or a crash).",
        "cache_disk_hits",
    ),
    "prefix_cache_disk_tokens": ("Prompt tokens read from the prefix cache's disk tier.", "cache_disk_tokens"),
    "cache_affinity_passes": (
        "Times a worker left a follow-up turn to the device whose prefix cache holds its history.",
        "affinity_passes",
    ),
    "model_switches": ("Times the batch changed model.", "model_switches"),
    "model_load_failures": ("Model loads that failed.", "model_load_failures"),
    "jobs_passed_head": (
        "Jobs started ahead of the fair order's head, because their model was ready and the head's was not.",
        "passed_head",
    ),
}


def _service(snap: Reading) -> Iterator[Metric]:
    service = CounterMetricFamily(
        "onelane_flow_service_tokens",
        "Token units each flow's ended jobs used: prompt tokens read (not from a prefix cache) times "
        "ONELANE_FAIR_PROMPT_WEIGHT, plus generated tokens times ONELANE_FAIR_OUTPUT_WEIGHT (the fair order's charge; "
        "'auto': as the worker measured it, onelane_model_token_cost).",
        labels=["flow"],
    )
    for flow, units in snap.service:
        service.add_metric([flow], units)
    yield service


def _counters(stats: dict[str, str]) -> Iterator[Metric]:
    def total(field: str) -> float:
        return float(stats.get(field, 0))

    for name, (help_text, field) in COUNTERS.items():
        yield CounterMetricFamily(f"onelane_{name}", help_text, value=total(field))
    rejected = CounterMetricFamily("onelane_jobs_rejected", "Submissions refused, by reason.", labels=["reason"])
    for reason in REJECTED:
        rejected.add_metric([reason], total(f"rejected:{reason}"))
    yield rejected
    finished = CounterMetricFamily("onelane_jobs_finished", "Jobs that reached a terminal state.", labels=["status"])
    for status in (s.value for s in JobStatus if s.ended):
        finished.add_metric([status], total(f"finished:{status}"))
    yield finished
    tokens = CounterMetricFamily("onelane_model_tokens_generated", "Tokens generated, by model.", labels=["model"])
    ended = CounterMetricFamily(
        "onelane_model_jobs_finished",
        "Jobs that ended after starting, by model and status.",
        labels=["model", "status"],
    )
    proposed = CounterMetricFamily(
        "onelane_model_tokens_proposed",
        "Tokens proposed for a step to check (speculation: prompt lookup), by model; of them, "
        "onelane_model_tokens_accepted were kept.",
        labels=["model"],
    )
    accepted = CounterMetricFamily(
        "onelane_model_tokens_accepted", "Proposed tokens a step kept (speculation), by model.", labels=["model"]
    )
    by_model = {"model_tokens:": tokens, "model_proposed:": proposed, "model_accepted:": accepted}
    for field, value in stats.items():
        prefix = next((p for p in by_model if field.startswith(p)), None)
        if prefix is not None:
            by_model[prefix].add_metric([field.removeprefix(prefix)], float(value))
        elif field.startswith("model_finished:"):
            model, _, status = field.removeprefix("model_finished:").rpartition(":")
            ended.add_metric([model, status], float(value))
    yield tokens
    yield ended
    yield proposed
    yield accepted


def _lua_buckets() -> tuple[str, ...]:
    """The histograms' upper bounds as the scripts write them: tasks/lua/common.lua's BUCKETS, read from there so
    the two never differ."""
    source = resources.files("tasks").joinpath("lua/common.lua").read_text()
    listed = re.search(r"^local BUCKETS = \{(.*)\}", source, re.MULTILINE)
    assert listed, "tasks/lua/common.lua defines BUCKETS"
    return tuple(bound.strip() for bound in listed.group(1).split(","))


BUCKETS = _lua_buckets()


def _histograms(stats: dict[str, str]) -> Iterator[Metric]:
    """Every bucket of every histogram, the empty ones too: a bucket appearing at its first observation is a new
    series to Prometheus, and a histogram's quantiles need the same bounds at every scrape."""
    counted: dict[str, dict[str, float]] = defaultdict(dict)
    for field, value in stats.items():
        if field.startswith("h:"):
            _, name, le = field.split(":", 2)
            counted[name][le] = float(value)
    for name, help_text in HISTOGRAMS.items():
        found = counted.get(name, {})
        total_sum = found.pop("sum", 0.0)
        per_bucket = dict.fromkeys([*BUCKETS, "+Inf"], 0.0)
        for le, count in found.items():  # (a bound BUCKETS no longer lists counts in the next one it does)
            per_bucket[_bucket_of(float(le))] += count
        cumulative, running = [], 0.0
        for le, count in per_bucket.items():
            running += count
            cumulative.append((le, running))
        yield HistogramMetricFamily(f"onelane_{name}_seconds", help_text, buckets=cumulative, sum_value=total_sum)


def _bucket_of(value: float) -> str:
    return next((le for le in BUCKETS if value <= float(le)), "+Inf")
