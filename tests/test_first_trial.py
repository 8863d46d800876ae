"""A newcomer's first trial, as the README leads it (issue 47): a Hugging Face id on a machine that cannot download
it says why in one line and the server is not ready; an image sent to a text-only model is refused as an image; a
short trial writes no more of the prefix cache to disk than ONELANE_PREFIX_CACHE_DISK."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.helpers import wait_ended

HUB_ID = "onelane-tests/not-downloaded-4bit"  # a valid id, in no cache of this machine


def test_a_hugging_face_id_that_cannot_be_downloaded_says_why_in_one_line_and_the_server_is_not_ready(
    settings, start_worker, make_app, monkeypatch, caplog
):
    # Given a machine that cannot reach Hugging Face, serving an id it never downloaded (the README's Qwen3, offline)
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    served = settings.model_copy(update={"model": HUB_ID})

    # When the worker starts, and loads it
    with caplog.at_level(logging.INFO, logger="worker"):
        start_worker(served)

    # Then the log says why in one line, the traceback kept for debugging
    (said,) = [r for r in caplog.records if r.name == "worker.models" and "failed to load:" in r.getMessage()]
    assert said.exc_info is None and "\n" not in said.getMessage()
    assert f"{HUB_ID} is a Hugging Face id" in said.getMessage() and f"hf download {HUB_ID}" in said.getMessage()
    # And /readyz is not ready while its only model has failed, saying why
    client = make_app(served).test_client()
    ready = client.get("/readyz")
    assert ready.status_code == 503, ready.get_json()
    assert "not in this machine's cache" in ready.get_json()["error"]["message"]
    # And a job for it is refused with the same cause
    refused = client.post("/v1/jobs", json={"messages": [{"role": "user", "content": "Hi"}]})
    assert refused.status_code == 503 and f"hf download {HUB_ID}" in refused.get_json()["error"]["message"]


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@pytest.mark.parametrize(
    "path,body,where",
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, IMAGE]}]},
            "messages[0].content[1]",
        ),
        (
            "/v1/responses",
            {
                "input": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,iVBO"}]},
                ]
            },
            "input[1].content[0]",
        ),
        ("/v1/jobs", {"messages": [{"role": "user", "content": [IMAGE]}]}, "messages[0].content[0]"),
    ],
    ids=["chat", "responses", "jobs"],
)
def test_an_image_sent_to_a_text_only_model_is_refused_as_an_image(app, model, path, body, where):
    # Given a chat message holding an image, When it is sent to the (text-only) model
    answer = app.test_client().post(path, json={"model": model, **body})
    # Then the refusal names the model and says that it cannot read images, not what text parts want (the image
    # itself is read only for a model that reads images)
    assert answer.status_code in (400, 422), answer.get_json()  # (/v1/jobs answers a bad field 422)
    error = answer.get_json()["error"]
    assert error["message"].startswith(f"the model '{model}' reads text only: it cannot read the images"), error
    assert "this server serves no model that reads images" in error["message"]
    assert error["param"] == where.split("[")[0]


def ask(jobs, store, n: int) -> None:  # type: ignore[no-untyped-def]
    """A short chat that leaves its state in the prefix cache (all three of one length)."""
    job = jobs.submit(
        messages=[{"role": "user", "content": f"Question {n}: what is a queue?"}], max_tokens=8, ignore_eos=True
    )
    assert wait_ended(store, job["id"])["status"] == "completed"


def written(folder: Path) -> list[Path]:
    """The prefix cache's files, the newest first."""
    return sorted(folder.glob("*.safetensors"), key=lambda f: f.stat().st_mtime, reverse=True)


def test_a_short_trial_writes_at_most_ONELANE_PREFIX_CACHE_DISK_of_the_prefix_cache_the_newest_entries(
    jobs, store, start_worker
):
    # Given a short trial: three chats, their states written to disk under a roomy bound
    first = start_worker()
    for n in range(3):
        ask(jobs, store, n)
    first.stop()
    folder = first.settings.prefix_cache_folder
    everything = written(folder)
    assert len(everything) == 3
    bound = int(everything[0].stat().st_size * 1.5)  # the newest entry, not two

    # When the next worker, with ONELANE_PREFIX_CACHE_DISK at that bound, answers one more
    second = start_worker(prefix_cache_disk_bytes=bound)
    ask(jobs, store, 3)
    second.stop()

    # Then the folder holds at most the bound: the newest entry alone
    (newest,) = written(folder)
    assert newest.stat().st_size <= bound and newest not in everything
    # And with 0 nothing more is written
    third = start_worker(prefix_cache_disk_bytes=0)
    ask(jobs, store, 4)
    third.stop()
    assert written(folder) == [newest]
