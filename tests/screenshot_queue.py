"""Not a test of the suite (pytest collects test_*.py only): the dashboard's screenshot in the README, retaken with

    ONELANE_SCREENSHOT=web/static/queue.png .venv/bin/python -m pytest tests/screenshot_queue.py

A few users and a few minutes of real traffic on the demo model, then the admin's dashboard saved as an image.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tasks import keys
from tests.helpers import BUSY, wait_ended
from tests.test_dashboard import settings, sign_in, submit  # noqa: F401 (fixture)


@pytest.mark.timeout(1200)
def test_take_the_screenshot(chromium, settings, make_app, store, start_worker):  # noqa: F811
    """Not a check: a few users and a few minutes of real traffic (ONELANE_SCREENSHOT_ROUNDS, about 30 s each) on
    the demo model under its usual name, then the admin's dashboard saved as an image."""
    import threading
    import time

    from werkzeug.serving import make_server

    from tasks.catalogue import ModelConfig

    demo = {"model": None, "models": (ModelConfig(name="onelane-demo", path=settings.model_path),)}
    app = make_app(settings.model_copy(update=demo))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    c = app.test_client()
    start_worker(**demo, max_batch=4, kv_budget_tokens=5 * BUSY)  # four endless jobs fit together
    users = ("alice", "bob", "carol")
    for round_ in range(int(os.environ.get("ONELANE_SCREENSHOT_ROUNDS", "8"))):
        ids = [
            submit(
                c,
                users[(round_ + n) % 3],
                f"round {round_}: question {n}",
                max_tokens=300 * (1 + n % 4),
                ignore_eos=True,
            )
            for n in range(4 + 4 * (round_ % 3))
        ]
        for job_id in ids:
            wait_ended(store, job_id, timeout_s=120)
        time.sleep(10 + 10 * (round_ % 3))  # traffic spread over minutes, so the plots have a shape
    prompts = [
        "Summarise the meeting notes",
        "Translate this paragraph into French",
        "Write a haiku about queues",
        "Explain continuous batching",
        "List three fair-queuing algorithms",
    ]
    for n, user in enumerate(["bob", "alice", "bob", "carol", "alice", "carol", "bob", "alice"]):
        submit(c, user, prompts[n % 5], max_tokens=BUSY, ignore_eos=True)
    for user in ("carol", "bob"):
        assert wait_ended(store, submit(c, user, "too late for this", ttl_s=0.5))["status"] == "expired"
    base_url = f"http://127.0.0.1:{server.server_port}"
    context = chromium.new_context(base_url=base_url, viewport={"width": 1280, "height": 1400})
    page = context.new_page()
    sign_in(page, "kr")
    page.goto("/queue")
    page.wait_for_function("() => document.querySelectorAll('#running tbody tr').length === 4")
    page.wait_for_timeout(2500)  # one more poll, so the running jobs show tokens and speed
    page.screenshot(path=str(Path(os.environ["ONELANE_SCREENSHOT"])), full_page=True)
    context.close()
    for job_id in store.redis.zrange(keys.IN_PROGRESS, 0, -1) + store.redis.zrange(keys.QUEUE, 0, -1):
        store.cancel(job_id, store.get(job_id).owner)
    server.shutdown()
