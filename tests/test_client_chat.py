"""`onelane chat` against a live stack: each line a turn answered with the conversation so far (its history read
from the prefix cache), a refused turn dropped, Ctrl-C stopping one answer and the chat going on."""

from __future__ import annotations

import signal

from tests.helpers import BUSY, wait_ended, wait_event
from tests.test_client import onelane, printed, read_until, start

SYSTEM = "You answer questions about queues and the people who wait in them, briefly and kindly. " * 6


def test_each_turn_is_answered_with_the_conversation_so_far(store, start_worker, live_server):
    start_worker()

    done = onelane(
        live_server,
        "chat",
        "--system",
        SYSTEM,
        "--max-tokens",
        "6",
        stdin="My name is Ada.\n\nWhat is it?\n/bye\nlost\n",
    )

    assert done.returncode == 0, done.stderr
    second, first = store.list("local")  # newest first: the blank line and what follows /bye sent nothing
    assert [(m.role, m.content) for m in second.spec.messages] == [
        ("system", SYSTEM),
        ("user", "My name is Ada."),
        ("assistant", first.output),
        ("user", "What is it?"),
    ]
    assert done.stdout == printed(first.output) + printed(second.output)
    assert second.usage.cached_tokens > 0  # the history came from the prefix cache


def test_a_refused_turn_is_dropped_and_the_chat_goes_on(store, start_worker, live_server, settings):
    start_worker()
    too_long = "x" * (settings.max_prompt_chars + 1)

    done = onelane(live_server, "chat", "--max-tokens", "3", stdin=f"{too_long}\nhi\n")

    assert done.returncode == 0, done.stderr  # the end of its input ends the chat
    assert "not sent" in done.stderr and "prompt_too_large" in done.stderr
    (job,) = store.list("local")
    assert [(m.role, m.content) for m in job.spec.messages] == [("user", "hi")]


def test_ctrl_c_stops_one_answer_and_the_chat_goes_on_until_a_kill_ends_it(jobs, store, start_worker, live_server):
    # Given the worker busy with a long job, and a chat whose turn waits behind it
    start_worker()
    busy = jobs.submit("busy", max_tokens=BUSY, ignore_eos=True)
    wait_event(store, busy["id"], lambda e: e.type == "token")
    chat = start(live_server, "chat", "--max-tokens", "3")
    try:
        chat.stdin.write(b"patience\n")  # type: ignore[union-attr]
        chat.stdin.flush()  # type: ignore[union-attr]
        read_until(chat.stderr, "in queue")
        (waiting,) = [job for job in store.list("local") if job.id != busy["id"]]

        # When Ctrl-C comes, Then that turn's job is cancelled and the chat takes the next line
        chat.send_signal(signal.SIGINT)
        read_until(chat.stderr, "stopped")
        assert wait_ended(store, waiting.id)["status"] == "cancelled"
        chat.stdin.write(b"again\n")  # type: ignore[union-attr]
        chat.stdin.flush()  # type: ignore[union-attr]
        read_until(chat.stderr, "in queue")
        again = next(job for job in store.list("local") if job.id not in (busy["id"], waiting.id))
        assert [(m.role, m.content) for m in again.spec.messages] == [("user", "again")]  # the stopped turn is gone

        # And SIGTERM (a kill, a closed terminal) cancels the waiting turn and ends the chat
        chat.send_signal(signal.SIGTERM)
        assert chat.wait(timeout=30) == 130
        assert wait_ended(store, again.id)["status"] == "cancelled"
    finally:
        chat.kill()
        jobs.cancel(busy["id"])


def test_a_reader_that_leaves_ends_the_chat_quietly(store, start_worker, live_server):
    # Given a chat whose stdout's reader is gone (as after `| head -c 0`), When a turn's answer comes
    start_worker()
    chat = start(live_server, "chat", "--max-tokens", "8")
    chat.stdout.close()  # type: ignore[union-attr]
    chat.stdin.write(b"hi\n")  # type: ignore[union-attr]
    chat.stdin.flush()  # type: ignore[union-attr]

    # Then it leaves with 141 (128 + SIGPIPE, as a shell reports), its job ended, and no traceback
    assert chat.wait(timeout=30) == 141
    (job,) = store.list("local")
    assert wait_ended(store, job.id)["status"] in ("completed", "cancelled")
    said = chat.stderr.read().decode()  # type: ignore[union-attr]
    assert "Traceback" not in said and "Exception ignored" not in said
