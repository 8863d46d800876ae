"""Images in a prompt, as clients send them and as the door checks them, before any reaches the worker.

An image comes inline, as a `data:` URL (`data:image/png;base64,…`), or as an `http(s)` URL, fetched by the web only
from the hosts an operator lists (ONELANE_IMAGE_HOSTS; none by default), and refused by name otherwise: a server that
fetches any URL a client names is a hole into the network it sits in (SSRF). tasks/image_fetch.py says how a URL is
fetched: what was checked, from a public address, within one deadline.

Each image is then read by an image reader, a child process of the web (tasks/image_reader.py, run as
tasks/children.py runs its children), which checks it and makes it what the model reads, with its own bounds of CPU
time and memory, while the web only waits on a socket: its format (PNG, JPEG, WebP, GIF: the one its data: URL
says), its pixels (ONELANE_IMAGE_MAX_PIXELS, from its header), a still image, a JPEG of a sane number of scans, and
one that decodes whole; then upright, 8 bits, and no larger than the model's processor reads (tasks/image_fit.py).
An image read past READ_S, or that crashes its reader, is a 400; one that finds every reader busy for WAIT_S, a 503.
A prompt holds at most ONELANE_MAX_IMAGES images, counting those of its history that a conversation resends from the
server's own record (a follow-up on the page, a previous response); each is at most ONELANE_IMAGE_MAX_BYTES.

What the job records is each image's digest (SHA-256 of the bytes kept) and its place in the message's text; the
bytes go to Redis under that digest as the job is admitted (tasks/store/images.py says for how long), and the
worker reads them from there. The digest also names the image in the prefix cache: a follow-up about the same image
reads no pixels again.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass

from tasks.children import ChildKind, Children, Crashed, Overran
from tasks.errors import ImageReaderBusy, InvalidRequest, PromptTooLarge
from tasks.image_fetch import fetch, target
from tasks.image_fit import UNKNOWN, Fit
from tasks.image_reader import FORMATS
from tasks.job import Message, Picture

READ_S = 20.0  # one image's reading, at most (a 4096 x 4096 photo takes its reader 1-3 s on a loaded machine)
WAIT_S = 10.0  # waiting for a free reader, at most
READERS = Children(
    ChildKind(
        module="tasks.image_reader", name="image reader", size=2, answer_s=READ_S, wait_s=WAIT_S, busy=ImageReaderBusy
    )
)
MIMES = tuple(FORMATS.values())
_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(?:;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,")


@dataclass(frozen=True)
class ImageRules:
    """What the door takes of a prompt's images (the server's settings, and the model's processor's size)."""

    max_bytes: int = 8 * 2**20
    max_pixels: int = 4096 * 4096
    max_images: int = 4
    hosts: tuple[str, ...] = ()  # whose http(s) URLs are fetched
    private_hosts: bool = False  # whether a listed host may be a private address
    fetch_s: float = 10.0  # one URL's fetch, at most
    fit: Fit = UNKNOWN


def picture(url: str, at: int, param: str) -> Picture:
    """The image a content part's URL holds, at character `at` of its message's text (its bytes kept with it, not
    recorded), or InvalidRequest naming `param`. Only its encoding is checked here; `checked` reads the image."""
    if not isinstance(url, str) or not url:
        raise InvalidRequest("an image part needs a URL: data:image/png;base64,…", param=param)
    scheme = url.split(":", 1)[0].lower()
    if scheme in ("http", "https"):  # fetched at the door, if its host is allowed (`checked`)
        return Picture(digest=hashlib.sha256(url.encode()).hexdigest(), at=at, url=url)
    match = _DATA_URL.match(url)
    if scheme != "data" or match is None or match["b64"] is None:
        raise InvalidRequest("an image is sent as a base64 data: URL (data:image/png;base64,…)", param=param)
    try:
        data = base64.b64decode(url[match.end() :], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("the image's data: URL is not valid base64", param=param) from None
    if not data:
        raise InvalidRequest("the image is empty", param=param)
    declared = (match["mime"] or "").lower()
    if declared not in MIMES:
        raise InvalidRequest(
            f"an image's data: URL says {declared or 'no type'!r}; it must say one of {', '.join(MIMES)}", param=param
        )
    return Picture(digest=hashlib.sha256(data).hexdigest(), at=at, mime=declared, data=data)


def assemble(parts: list[tuple[str, str]], param: str) -> tuple[str, tuple[Picture, ...]]:
    """A message's text and images from its content parts in order: ("text", words) or ("image", url)."""
    text, pictures = "", []
    for kind, value in parts:
        if kind == "image":
            pictures.append(picture(value, len(text), param))
        else:
            text += value
    return text, tuple(pictures)


def checked(messages: tuple[Message, ...], rules: ImageRules, param: str) -> tuple[Message, ...]:
    """The messages, each image they bring fetched, read, checked and made what the model reads (see the module's
    docstring), its format and size recorded; InvalidRequest (or PromptTooLarge for one too large) naming `param`
    otherwise. An image of the history a conversation resends from the server's own record comes without its bytes
    (it was read when first sent), but counts against the prompt's images all the same."""
    count = sum(len(m.images) for m in messages)
    if count > rules.max_images:
        raise InvalidRequest(
            f"the prompt holds {count} images (its history's too); this server takes at most {rules.max_images} a "
            "prompt: start a new conversation, or send fewer",
            param=param,
        )
    return tuple(
        m.model_copy(update={"images": tuple(_read(_fetched(p, rules, param), rules, param) for p in m.images)})
        if any(p.data is not None or p.url is not None for p in m.images)
        else m
        for m in messages
    )


def allowed(host: str, hosts: tuple[str, ...]) -> bool:
    """Whether `host` is one the operator lists (".example.com" stands for any host below example.com)."""
    host = host.lower().rstrip(".")
    return any(host == h or (h.startswith(".") and host.endswith(h)) for h in hosts)


def _fetched(p: Picture, rules: ImageRules, param: str) -> Picture:
    """An image named by an http(s) URL, fetched if its host is allowed; InvalidRequest otherwise."""
    if p.url is None:
        return p
    url = target(p.url, param)
    if not allowed(url.host, rules.hosts):
        told = f"only from {', '.join(rules.hosts)}" if rules.hosts else "from no host"
        raise InvalidRequest(
            f"image URLs are fetched {told} (ONELANE_IMAGE_HOSTS): {url.host!r} is not one of them; "
            "send the image inline, as a data: URL (data:image/png;base64,…)",
            param=param,
        )
    data = fetch(url, rules.max_bytes, rules.fetch_s, rules.private_hosts, param)
    return Picture(digest=hashlib.sha256(data).hexdigest(), at=p.at, data=data)


def _read(p: Picture, rules: ImageRules, param: str) -> Picture:
    """The image read by an image reader: as it came, or as the reader made it (a digest of the bytes kept)."""
    if p.data is None:  # (resent from the server's record: read when first sent)
        return p
    data = p.data
    if len(data) > rules.max_bytes:
        raise PromptTooLarge(
            f"an image has {len(data)} bytes; this server takes at most {rules.max_bytes}", param=param
        )
    request = {"mime": p.mime, "max_pixels": rules.max_pixels, "fit": rules.fit.json()}
    try:
        answer, made = READERS.ask(request, data)
    except Overran as exc:  # ("it takes more than READ_S s")
        raise InvalidRequest(f"an image could not be read in time: {exc}; send a smaller one", param=param) from None
    except Crashed:
        raise InvalidRequest(
            "an image could not be read within this server's bounds (CPU time and memory); send a smaller one",
            param=param,
        ) from None
    if "status" in answer:
        raise (PromptTooLarge if answer["status"] == 413 else InvalidRequest)(answer["message"], param=param)
    digest = p.digest
    if answer["changed"]:
        data, digest = made, hashlib.sha256(made).hexdigest()
    return p.model_copy(
        update={
            "digest": digest,
            "mime": answer["mime"],
            "width": answer["width"],
            "height": answer["height"],
            "data": data,
        }
    )
