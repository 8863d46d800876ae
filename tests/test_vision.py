"""Images in the prompt through the one lane (issue 49): tiny random-weight vision-language models (tests/tiny_vision.py:
Gemma 3 and SmolVLM) served from one models file beside a text model, by the real worker, through the official
clients unchanged.

An answer about an image is mlx-vlm's own (`mlx_vlm.generate`, greedy, that prompt alone), token for token, whether
it runs alone or joins a batch that goes on decoding; a follow-up about the same image reads no pixels; what a
hostile client can send (a URL to fetch, a decompression bomb, too many or too large images, not an image) is refused
at the door by name.
"""

from __future__ import annotations

import base64
import io
import random
import struct
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest
import requests
from PIL import Image

from tasks.settings import Settings
from tests.helpers import openai_chunks, wait_batch
from tests.test_hostile_models import serve
from tests.test_openai_batches import by_custom_id, jsonl, submit
from tests.tiny_vision import build_gemma3, build_idefics3

pytestmark = pytest.mark.timeout(300)

QUESTION = "What is this?"
VISION = ("gemma", "smolvlm")


def png(color: str | tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def ask(image: bytes, text: str = QUESTION) -> list[dict[str, Any]]:
    return [{"type": "image_url", "image_url": {"url": data_url(image)}}, {"type": "text", "text": text}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vision")
    return {"gemma": build_gemma3(root / "gemma"), "smolvlm": build_idefics3(root / "smolvlm")}


@pytest.fixture
def settings(settings: Settings, folders: dict[str, Path], demo_model: Path, tmp_path: Path) -> Settings:
    """A text model (the default) and two vision-language models, in one models file."""
    tables = {
        "chat": {"path": str(demo_model), "default": True},
        "gemma": {"path": str(folders["gemma"])},
        "smolvlm": {"path": str(folders["smolvlm"])},
    }
    # (image URLs may be fetched from this machine's loopback only, a private address: the stories' own image server)
    update = {"max_batch": 4, "prefill_step": 16, "image_hosts": ("127.0.0.1",), "image_private_hosts": True}
    return serve(settings.model_copy(update=update), tmp_path, **tables)[0]


@pytest.fixture
def worker(settings: Settings, start_worker):  # type: ignore[no-untyped-def]
    return start_worker(settings)


@pytest.fixture(scope="module")
def reference(folders: dict[str, Path]) -> Any:
    """mlx-vlm's own greedy answer about an image, that prompt alone (as its generate and its server read it): its
    tokens, written as onelane writes every model's tokens, with mlx-lm's streaming detokenizer (mlx-vlm's own keeps
    the leading space of an answer's first word, which mlx-lm's, and so mlx_lm.server's, trims)."""
    import mlx_vlm
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    loaded = {name: mlx_vlm.load(str(folder)) for name, folder in folders.items()}
    tokenizers = {name: load_tokenizer(folder) for name, folder in folders.items()}

    def text(model: str, ids: list[int]) -> str:
        ends = loaded[model][0].config.eos_token_id
        eos = set(ends) if isinstance(ends, list) else {ends}
        detokenizer = tokenizers[model].detokenizer
        detokenizer.reset()
        for token in ids:
            if token in eos:
                break
            detokenizer.add_token(token)
        detokenizer.finalize()
        return str(detokenizer.text)

    def answer(model: str, image: bytes, max_tokens: int, turns: list[dict[str, Any]] | None = None) -> str:
        vlm, processor = loaded[model]
        messages = turns or [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
        prompt = processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        picture = Image.open(io.BytesIO(image)).convert("RGB")
        out = mlx_vlm.generate(vlm, processor, prompt, image=[picture], max_tokens=max_tokens, temperature=0.0)
        return text(model, list(out.token_ids))

    return answer


def test_the_openai_client_asks_about_an_image_and_gets_the_models_own_answer(worker, live_server, reference):
    from openai import OpenAI

    client = OpenAI(base_url=f"{live_server}/v1", api_key="unused", max_retries=0)
    for model in VISION:
        for color in ("red", "blue"):
            answer = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": ask(png(color))}],  # type: ignore[misc, list-item]
                max_tokens=12,
                temperature=0,
            )
            assert answer.choices[0].message.content == reference(model, png(color), 12), (model, color)
    # and the two colors' answers differ: the image was read
    red, blue = (reference("gemma", png(c), 12) for c in ("red", "blue"))
    assert red != blue


def test_an_image_joins_the_running_batch_without_draining_it(worker, live_server, store, reference):
    # Given a long answer streaming on the vision model (text only)
    long = {"model": "gemma", "prompt": "once upon a time", "max_tokens": 600, "ignore_eos": True, "stream": True}
    with requests.post(f"{live_server}/v1/completions", json=long, stream=True, timeout=120) as stream:
        chunks = openai_chunks(stream)
        next(chunks)
        streaming = stream.headers["x-onelane-job-id"]

        # When two clients ask about images meanwhile
        answers: dict[str, requests.Response] = {}

        def about(color: str) -> None:
            body = {"model": "gemma", "messages": [{"role": "user", "content": ask(png(color))}], "max_tokens": 12}
            answers[color] = requests.post(
                f"{live_server}/v1/chat/completions", json=body | {"temperature": 0}, timeout=120
            )

        threads = [threading.Thread(target=about, args=(c,)) for c in ("red", "green")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # Then they were answered while the long answer still generated (the batch was not drained for them)
        assert store.get(streaming).status.value == "in_progress"
        for _ in chunks:
            pass
    assert store.get(streaming).usage.completion_tokens == 600
    # And each is the model's own answer about its image
    for color, reply in answers.items():
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == reference("gemma", png(color), 12)


def test_a_follow_up_about_the_same_image_reads_no_pixels(worker, live_server, reference):
    engine = lambda: worker.models.get_quietly("smolvlm")  # noqa: E731
    first = [{"role": "user", "content": ask(png("red"))}]
    body = {"model": "smolvlm", "max_tokens": 8, "temperature": 0}
    reply = requests.post(f"{live_server}/v1/chat/completions", json=body | {"messages": first}, timeout=120).json()
    assert engine().images_read == 1
    said = reply["choices"][0]["message"]["content"]
    turns = [*first, {"role": "assistant", "content": said}, {"role": "user", "content": "And its color?"}]

    follow = requests.post(f"{live_server}/v1/chat/completions", json=body | {"messages": turns}, timeout=120).json()

    assert engine().images_read == 1  # the image's prefix came from the cache
    assert follow["usage"]["prompt_tokens_details"]["cached_tokens"] >= reply["usage"]["prompt_tokens"]
    image_turn = [{"type": "image"}, {"type": "text", "text": QUESTION}]
    expected = reference(
        "smolvlm",
        png("red"),
        8,
        [
            {"role": "user", "content": image_turn},
            {"role": "assistant", "content": [{"type": "text", "text": said}]},
            {"role": "user", "content": [{"type": "text", "text": "And its color?"}]},
        ],
    )
    assert follow["choices"][0]["message"]["content"] == expected
    # while another image, in the same place, is read
    other = [{"role": "user", "content": ask(png("blue"))}]
    requests.post(f"{live_server}/v1/chat/completions", json=body | {"messages": other}, timeout=120).raise_for_status()
    assert engine().images_read == 2


def test_responses_jobs_and_batch_lines_take_images_too(worker, live_server, store, reference):
    from openai import OpenAI

    client = OpenAI(base_url=f"{live_server}/v1", api_key="unused", max_retries=0)
    expected = reference("gemma", png("red"), 10)
    # the Responses API's input_image
    response = client.responses.create(
        model="gemma",
        input=[  # type: ignore[list-item]
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": data_url(png("red")), "detail": "auto"},
                    {"type": "input_text", "text": QUESTION},
                ],
            }
        ],
        max_output_tokens=10,
        temperature=0,
    )
    assert response.output_text == expected
    # /v1/jobs, whose messages take the same parts
    job = {"model": "gemma", "messages": [{"role": "user", "content": ask(png("red"))}], "max_tokens": 10}
    submitted = requests.post(f"{live_server}/v1/jobs", json=job, timeout=30)
    assert submitted.status_code in (200, 201, 202), submitted.text
    job_id = submitted.json()["id"]
    from tests.helpers import wait_ended

    done = wait_ended(store, job_id, timeout_s=120)
    assert done["output"] == expected
    shown = requests.get(f"{live_server}/v1/jobs/{job_id}", timeout=30).json()["messages"][0]
    assert [(i["mime"], i["width"], i["height"], i["at"]) for i in shown["images"]] == [("image/png", 64, 48, 0)]
    # a Batch API line
    line = {
        "custom_id": "img",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "gemma",
            "messages": [{"role": "user", "content": ask(png("red"))}],
            "max_tokens": 10,
            "temperature": 0,
        },
    }
    batch = submit(client, jsonl(line))
    record = wait_batch(store, batch.id, timeout_s=120)
    lines = by_custom_id(client, record.output_file_id)
    assert lines["img"]["response"]["body"]["choices"][0]["message"]["content"] == expected


def bomb(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height RGB pixels, its data a few bytes."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def test_what_a_hostile_client_sends_is_refused_at_the_door_by_name(settings, live_server, store):
    def chat(content: Any, model: str = "gemma", role: str = "user") -> requests.Response:
        body = {"model": model, "messages": [{"role": role, "content": content}], "max_tokens": 4}
        return requests.post(f"{live_server}/v1/chat/completions", json=body, timeout=30)

    truncated = png("red")[:40]
    frames = [Image.new("L", (4, 4), 0) for _ in range(10_000)]
    for n, frame in enumerate(frames):  # (each unlike the one before: no frame is merged into another)
        frame.putpixel((n % 4, n // 4 % 4), 255)
    animated = io.BytesIO()
    frames[0].save(animated, "GIF", save_all=True, append_images=frames[1:], duration=10)
    refusals = [
        (chat(ask(png("red")), model="chat"), 400, "the model 'chat' reads text only"),
        (
            chat([{"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data"}}]),
            400,
            "fetched only from 127.0.0.1",
        ),
        (
            chat([{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]),
            400,
            "fetched only from 127.0.0.1",
        ),
        (chat([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]), 400, "not valid base64"),
        (chat([{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]), 400, "data: URL"),
        (
            chat([{"type": "image_url", "image_url": {"url": data_url(b"%PDF-1.4 not an image")}}]),
            400,
            "could not be read",
        ),
        (chat([{"type": "image_url", "image_url": {"url": data_url(truncated)}}]), 400, "could not be read"),
        (
            chat([{"type": "image_url", "image_url": {"url": data_url(bomb(10_000, 10_000))}}]),
            413,
            "10000x10000 pixels",
        ),
        (chat([{"type": "image_url", "image_url": {"url": data_url(bomb(30_000, 30_000))}}]), 413, "more pixels"),
        (
            chat(ask(png("red")) * 50),
            400,
            "the prompt holds 50 images (its history's too); this server takes at most 4",
        ),
        (chat([{"type": "image_url", "image_url": {"url": data_url(bomb(40_000, 40_000))}}]), 413, "more pixels"),
        (
            chat([{"type": "image_url", "image_url": {"url": data_url(animated.getvalue(), "image/gif")}}]),
            400,
            "animated",
        ),
        (
            chat([{"type": "image_url", "image_url": {"url": data_url(png("red"), "image/jpeg")}}]),
            400,
            "but the image is image/png",
        ),
        (chat([{"type": "image_url", "image_url": {"url": data_url(png("red"), "text/html")}}]), 400, "'text/html'"),
        (chat(ask(png("red")), role="assistant"), 400, "only a user's message"),
    ]
    for reply, status, words in refusals:
        assert reply.status_code == status, reply.text
        assert words in reply.json()["error"]["message"], reply.text
    assert "smolvlm" in refusals[0][0].json()["error"]["message"]  # it names the models that read images
    assert store.redis.zcard("onelane:queue") == 0  # nothing was admitted
    # /v1/models says which models read images
    listed = requests.get(f"{live_server}/v1/models", timeout=10).json()["data"]
    assert {m["id"]: m["vision"] for m in listed} == {"chat": False, "gemma": True, "smolvlm": True}


def test_an_image_is_bounded_by_its_bytes_and_a_still_gif_is_read(settings, live_server):
    from tasks.errors import PromptTooLarge
    from tasks.images import ImageRules, checked, picture
    from tasks.job import Message

    noise = Image.frombytes("RGB", (300, 300), random.Random(0).randbytes(300 * 300 * 3))
    out = io.BytesIO()
    noise.save(out, "PNG")
    big = out.getvalue()
    assert len(big) > 200_000  # larger than a text-only server's whole body (its limit: 32,000 characters' worth)
    # a server serving a model that reads images takes a body that large: the image is refused for what it is
    body = {"model": "chat", "messages": [{"role": "user", "content": ask(big)}], "max_tokens": 4}
    reply = requests.post(f"{live_server}/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == 400 and "reads text only" in reply.json()["error"]["message"]

    def read(data: bytes, max_bytes: int = 8 * 2**20, mime: str = "image/png") -> Any:
        message = Message(role="user", content="q", images=(picture(data_url(data, mime), 0, "messages"),))
        return checked((message,), ImageRules(max_bytes=max_bytes), "messages")[0].images[0]

    with pytest.raises(PromptTooLarge, match="at most 100000"):
        read(big, max_bytes=100_000)
    still = io.BytesIO()
    Image.new("P", (8, 8), 3).save(still, "GIF")
    assert (read(still.getvalue(), mime="image/gif").mime, read(big).width) == ("image/gif", 300)


def test_a_worker_killed_while_it_answers_about_an_image_loses_nothing(
    settings, folders, tmp_path, worker_process, store, reference
):
    import os
    import signal

    from tasks.images import picture
    from tasks.job import JobSpec, Message, SamplingParams, new_job_id
    from tests.helpers import wait_ended, wait_event
    from tests.test_recovery import wait_for_worker

    # Given `onelane worker` answering about an image at length
    _, env = serve(settings, tmp_path, gemma={"path": str(folders["gemma"])})
    worker_process(**env)
    wait_for_worker(store)
    image = picture(data_url(png("red")), 0, "messages")
    message = Message(role="user", content=QUESTION, images=(image,))
    params = SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True)  # seconds of work: killed at once
    spec = JobSpec(owner="u", model="gemma", messages=(message,), params=params)
    alone = store.admit(new_job_id(), spec, 300)  # the answer with nothing cut
    alone_done = wait_ended(store, alone.id, timeout_s=240)
    alone_output, length = alone_done["output"], alone_done["usage"]["completion_tokens"]
    job_id = new_job_id()
    store.admit(job_id, spec, 300)
    wait_event(store, job_id, lambda e: e.type == "token", timeout_s=60)
    # When its worker is killed as it generates (the one holding the device now, not necessarily the first)
    os.kill(wait_for_worker(store).pid, signal.SIGKILL)
    # Then the next worker reads the image again (its bytes are still kept) and goes on: the answer is the same
    done = wait_ended(store, job_id, timeout_s=240)
    assert (done["status"], done["attempts"], done["usage"]["completion_tokens"]) == ("completed", 2, length)
    assert done["output"] == alone_output and length > 500


def test_the_web_page_attaches_an_image_shows_it_and_follows_up(worker, page, store, tmp_path, reference):
    import re

    from tests.helpers import wait_ended

    picture = tmp_path / "red.png"
    picture.write_bytes(png("red"))
    # Given the form, When a question is sent with an image attached, to a model that reads images
    page.goto("/")
    page.fill("#prompt", QUESTION)
    page.fill("#max_tokens", "8")
    page.select_option("#model", "smolvlm")
    page.set_input_files("#image", str(picture))
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/jobs/job_[\w-]+$"))
    job_id = page.url.rsplit("/", 1)[1]
    # Then its page shows the image in the user's turn, and the model's own answer about it
    done = wait_ended(store, job_id, timeout_s=120)
    assert (done["status"], done["output"]) == ("completed", reference("smolvlm", png("red"), 8))
    page.reload()
    shown = page.locator(".turn[data-role=user] img.attached")
    assert shown.count() == 1
    assert page.evaluate("(img) => img.naturalWidth", shown.element_handle()) == 64  # the image, served to its owner
    # And a follow-up goes on from the image's prefix (no pixels read again)
    # (SmolVLM: the tiny Gemma 3's 16-token sliding window has rotated past its image by the answer's end, and a
    # window that rotated cannot be cut back to a shorter prefix: a real Gemma 3's window is 1,024 tokens)
    engine = worker.models.get_quietly("smolvlm")
    read = engine.images_read
    page.fill("#follow-up", "And its color?")
    page.click("#continue button[type=submit]")
    page.wait_for_url(lambda url: re.search(r"/jobs/job_[\w-]+$", url) is not None and job_id not in url)
    follow = page.url.rsplit("/", 1)[1]
    assert follow != job_id
    assert wait_ended(store, follow, timeout_s=120)["status"] == "completed"
    assert engine.images_read == read
    # while the image stays another user's to see: a new browser profile is a new visitor
    other = page.context.browser.new_context(base_url=page.url.split("/jobs/")[0]).new_page()
    digest = store.get(job_id).spec.messages[0].images[0].digest
    assert other.goto(f"/jobs/{job_id}/images/{digest}").status == 404
    other.context.close()


def test_onelane_run_asks_about_an_image_file(worker, live_server, tmp_path, reference):
    from tests.test_client import onelane

    picture = tmp_path / "blue.png"
    picture.write_bytes(png("blue"))
    done = onelane(live_server, "run", "--model", "gemma", "--max-tokens", "8", "--image", str(picture), QUESTION)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip("\n") == reference("gemma", png("blue"), 8)
    # a missing file, or an image with --raw text, is a one-line error before anything is sent
    missing = onelane(live_server, "run", "--image", str(tmp_path / "nope.png"), QUESTION)
    assert missing.returncode == 2 and "nope.png" in missing.stderr
    raw = onelane(live_server, "run", "--raw", "--image", str(picture), QUESTION)
    assert raw.returncode != 0 and "not with --raw" in raw.stderr


def test_an_image_url_is_fetched_only_from_the_hosts_the_operator_lists(settings, live_server, jobs):
    import hashlib
    import http.server

    red = png("red")

    class Images(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/moved.png":
                self.send_response(302)
                self.send_header("Location", "http://169.254.169.254/latest/meta-data")
                self.end_headers()
                return
            if self.path == "/huge.png":
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"\0" * (settings.image_max_bytes + 65536))
                return
            known = self.path == "/red.png"
            self.send_response(200 if known else 404)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            self.wfile.write(red if known else b"")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Images)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:

        def job(url: str) -> requests.Response:
            parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
            body = {"model": "gemma", "messages": [{"role": "user", "content": parts}], "max_tokens": 4}
            return requests.post(f"{live_server}/v1/jobs", json=body, timeout=30)

        # a listed host's image is fetched at the door, and kept as any inline image
        fetched = job(f"{base}/red.png")
        assert fetched.status_code in (200, 201, 202), fetched.text
        image = fetched.json()["messages"][0]["images"][0]
        assert (image["digest"], image["mime"]) == (hashlib.sha256(red).hexdigest(), "image/png")
        # a redirect is not followed, a missing image or one too large is refused (tests/test_image_urls.py)
        for path, status, words in (
            ("/moved.png", 422, "could not be fetched"),  # (/v1/jobs answers an invalid request 422)
            ("/missing.png", 422, "could not be fetched"),
            ("/huge.png", 413, "more than"),
        ):
            reply = job(f"{base}{path}")
            assert reply.status_code == status and words in reply.json()["error"]["message"], reply.text
        # a host not listed is never asked (the name alone refuses it)
        reply = job(f"http://localhost:{server.server_port}/red.png")
        assert reply.status_code == 422 and "'localhost' is not one of them" in reply.json()["error"]["message"]
    finally:
        server.shutdown()
        server.server_close()


def test_an_answer_about_an_image_may_be_held_to_a_schema(worker, live_server):
    import json

    # (a grammar reads each sequence's tokens as it decodes: the image's, named past the vocabulary, among them)
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "blue"]}}, "required": ["color"]}
    body = {
        "model": "gemma",
        "messages": [{"role": "user", "content": ask(png("red"), "Which color? Answer in JSON.")}],
        "max_tokens": 40,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "color", "schema": schema}},
    }
    reply = requests.post(f"{live_server}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    answer = reply.json()["choices"][0]
    assert answer["message"]["content"].lstrip().startswith("{")
    if answer["finish_reason"] == "stop":
        assert json.loads(answer["message"]["content"])["color"] in ("red", "blue")
