"""/readyz tells the truth about the default model (issue 60, item 9): not ready while it loads (a job admitted then
is told the load's time in its ETA), and not ready, with the reason, for as long as it cannot load, an idle worker
trying it again when due; the form shows a notice meanwhile."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from tasks.catalogue import ModelConfig
from worker.models import ModelPool

HUB_ID = "onelane-tests/not-downloaded-4bit"  # a valid id, in no cache of this machine


def readyz_until(client: Any, status: int, timeout_s: float = 60) -> dict[str, Any]:
    """Ask /readyz until it answers `status`; its body."""
    deadline = time.monotonic() + timeout_s
    while (answer := client.get("/readyz")).status_code != status:
        assert time.monotonic() < deadline, answer.get_json()
        time.sleep(0.05)  # a poll: what /readyz reads changes in Redis, announced nowhere
    body: dict[str, Any] = answer.get_json()
    return body


def test_readyz_is_not_ready_while_the_default_model_loads_and_the_first_eta_counts_the_load(
    settings, start_worker, make_app, monkeypatch
):
    # Given a worker whose load of the default model is held until the story lets it go
    let_go, reading = threading.Event(), threading.Event()
    read = ModelPool._read

    def held_read(pool: ModelPool, config: Any) -> Any:
        reading.set()
        assert let_go.wait(60)
        return read(pool, config)

    monkeypatch.setattr(ModelPool, "_read", held_read)
    client = make_app(settings).test_client()
    starting = threading.Thread(target=start_worker, args=(settings,))
    starting.start()
    try:
        assert reading.wait(60)
        # When /readyz is asked while the model loads
        body = readyz_until(client, 503, 5)
        while "is loading" not in body["error"]["message"]:  # (before its first report: no worker yet)
            body = readyz_until(client, 503, 5)
        # Then it is not ready, naming the model and why
        assert body["model"] == settings.model_name
        assert f"the default model {settings.model_name!r} is loading" in body["error"]["message"]
        assert {m["name"]: m["state"] for m in body["models"]}[settings.model_name] == "loading"
        # And a job admitted now is told it starts once the load is done, not at once
        job = client.post("/v1/jobs", json={"prompt": "hello", "max_tokens": 4}).get_json()
        assert job["eta_s"] >= 1.0, job
        # And the form says so before anything is run
        page = client.get("/").get_data(as_text=True)
        assert 'id="model-notice"' in page and "is loading (" in page and "a job waits until it is ready" in page
    finally:
        let_go.set()
        starting.join(120)
    # When the load ends, Then it is ready, and the form says nothing of the model
    assert readyz_until(client, 200)["status"] == "ready"
    assert 'id="model-notice"' not in client.get("/").get_data(as_text=True)


def test_readyz_is_not_ready_with_the_reason_for_as_long_as_the_default_model_cannot_load(
    settings, start_worker, make_app, monkeypatch
):
    # Given a machine that cannot reach Hugging Face, serving an id it never downloaded, tried again every 2 s
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    served = settings.model_copy(update={"model": HUB_ID, "model_retry_s": 2.0})
    start_worker(served)
    client = make_app(served).test_client()

    # When /readyz is asked for four retry periods (8 s), no job asking for the model
    answers = []
    deadline = time.monotonic() + 4 * served.model_retry_s
    while time.monotonic() < deadline:
        answers.append(client.get("/readyz"))
        time.sleep(0.1)  # a poll: the story is what /readyz says over time

    # Then every answer is 503 with the model's name and the reason, and its record says it was tried again
    assert len(answers) > 10
    for answer in answers:
        body = answer.get_json()
        assert answer.status_code == 503 and body["model"] == HUB_ID, body
        assert "not in this machine's cache" in body["error"]["message"], body
    # And the form tells it before anything is run
    assert "not in this machine&#39;s cache" in client.get("/").get_data(as_text=True)


def test_a_served_model_of_an_architecture_the_library_lacks_is_told_at_start_not_to_its_first_user(
    settings, start_worker, make_app, demo_model, tmp_path, caplog
):
    # Given a models file serving the demo model and a vision folder naming an architecture mlx-vlm does not know
    folder = tmp_path / "future-vl"
    folder.mkdir()
    config = {"model_type": "qwen9_vl", "vision_config": {"model_type": "qwen9_vl"}, "text_config": {}}
    (folder / "config.json").write_text(json.dumps(config))
    served = settings.model_copy(
        update={
            "model": None,
            "models": (
                ModelConfig(name="demo", path=str(demo_model), default=True),
                ModelConfig(name="future", path=str(folder)),
            ),
        }
    )

    # When the worker starts, nobody having asked for it
    caplog.set_level(logging.INFO, logger="worker.models")
    start_worker(served)
    client = make_app(served).test_client()

    # Then its log says so once, in one line, naming it and why
    said = [r.getMessage() for r in caplog.records if "model future failed to load" in r.getMessage()]
    assert said == ["model future failed to load: its architecture 'qwen9_vl' is not one the installed mlx-vlm knows"]
    # And /readyz is ready (the default serves) and lists it as failed, with the reason
    body = readyz_until(client, 200)
    future = next(m for m in body["models"] if m["name"] == "future")
    assert future["state"] == "failed" and "'qwen9_vl'" in future["error"], future
    # And its first user is refused by name with a 503, not admitted to fail
    answer = client.post("/v1/chat/completions", json={"model": "future", "messages": [{"role": "user", "content": "?"}]})  # fmt: skip
    assert answer.status_code == 503 and answer.headers["Retry-After"]
    error = answer.get_json()["error"]
    assert error["code"] == "model_unavailable" and "'future'" in error["message"] and "qwen9_vl" in error["message"]
