"""Images in a prompt, as clients send them and as the server checks them, before any reaches the worker.

An image comes inline, as a `data:` URL (`data:image/png;base64,…`). An `http(s)` URL is fetched by the web only
from the hosts an operator lists (ONELANE_IMAGE_HOSTS; none by default), and refused by name otherwise: a server that
fetches any URL a client names is a hole into the network it sits in (SSRF). A fetch follows no redirect, reads at
most ONELANE_IMAGE_MAX_BYTES, and gives up after FETCH_TIMEOUT_S.

Each image is checked at the door, by reading its header and then decoding it (Pillow), in the web process:
- its bytes, at most ONELANE_IMAGE_MAX_BYTES;
- its format, one of PNG, JPEG, WebP and GIF, the one its data: URL says (a PNG sent as image/jpeg is refused, as
  Anthropic's API refuses it);
- its pixels, width × height at most ONELANE_IMAGE_MAX_PIXELS, read from the header before anything is decoded (a
  decompression bomb, a few KiB that would decode to gigabytes, is refused without being decoded);
- a still image: an animated GIF or WebP is refused (as OpenAI's API takes "non-animated GIF" only), so that no
  frame count reaches the decoder;
- it decodes whole (a truncated or corrupt file is a 400, not a worker's failure).
A request holds at most ONELANE_MAX_IMAGES images.

What the job records is each image's digest (SHA-256 of its bytes) and its place in the message's text; the bytes
go to Redis under that digest (tasks/keys.py `image`) for as long as the job may run, and the worker reads them from
there. The digest is also what names the image in the prefix cache: a follow-up about the same image reads no
pixels again.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import warnings

from tasks.errors import InvalidRequest, PromptTooLarge
from tasks.job import Message, Picture

FETCH_TIMEOUT_S = 10.0
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(?:;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,")


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
    if declared not in FORMATS.values():
        accepted = ", ".join(FORMATS.values())
        raise InvalidRequest(
            f"an image's data: URL says {declared or 'no type'!r}; it must say one of {accepted}", param=param
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


def checked(
    messages: tuple[Message, ...],
    max_bytes: int,
    max_pixels: int,
    max_images: int,
    param: str,
    hosts: tuple[str, ...] = (),
) -> tuple[Message, ...]:
    """The messages, each image they bring read and bounded (see the module's docstring), its format and size
    recorded; InvalidRequest (or PromptTooLarge for one too large) naming `param` otherwise. An image of the history
    a conversation resends from the server's own record (a follow-up, a previous response) comes without its bytes:
    it was read when first sent, and counts no more."""
    count = sum(1 for m in messages for p in m.images if p.data is not None or p.url is not None)
    if count > max_images:
        raise InvalidRequest(f"the request holds {count} images; this server takes at most {max_images}", param=param)
    return tuple(
        m.model_copy(
            update={
                "images": tuple(
                    _read(_fetched(p, hosts, max_bytes, param), max_bytes, max_pixels, param) for p in m.images
                )
            }
        )
        if any(p.data is not None or p.url is not None for p in m.images)
        else m
        for m in messages
    )


def allowed(host: str, hosts: tuple[str, ...]) -> bool:
    """Whether `host` is one the operator lists (".example.com" stands for any host below example.com)."""
    host = host.lower().rstrip(".")
    return any(host == h or (h.startswith(".") and host.endswith(h)) for h in hosts)


def _fetched(p: Picture, hosts: tuple[str, ...], max_bytes: int, param: str) -> Picture:
    """An image named by an http(s) URL, fetched if its host is allowed; InvalidRequest otherwise."""
    if p.url is None:
        return p
    from urllib.parse import urlsplit

    import requests

    host = urlsplit(p.url).hostname or ""
    if not allowed(host, hosts):
        told = f"only from {', '.join(hosts)}" if hosts else "from no host"
        raise InvalidRequest(
            f"image URLs are fetched {told} (ONELANE_IMAGE_HOSTS): {host or 'this URL'!r} is not one of them; "
            "send the image inline, as a data: URL (data:image/png;base64,…)",
            param=param,
        )
    try:
        with requests.get(p.url, timeout=FETCH_TIMEOUT_S, stream=True, allow_redirects=False) as reply:
            if reply.status_code != 200:
                raise InvalidRequest(f"the image URL answered HTTP {reply.status_code}, not 200", param=param)
            data = b""
            for chunk in reply.iter_content(65536):
                data += chunk
                if len(data) > max_bytes:
                    raise PromptTooLarge(
                        f"the image at the URL has more than {max_bytes} bytes; this server takes at most that",
                        param=param,
                    )
    except requests.RequestException:
        raise InvalidRequest(
            "the image URL could not be fetched (no answer in time, or no connection)", param=param
        ) from None
    return Picture(digest=hashlib.sha256(data).hexdigest(), at=p.at, data=data)


def _read(p: Picture, max_bytes: int, max_pixels: int, param: str) -> Picture:
    from PIL import Image  # (the web's only use of Pillow: imported when an image comes)

    if p.data is None:  # (resent from the server's record: read when first sent)
        return p
    data = p.data
    if len(data) > max_bytes:
        raise PromptTooLarge(f"an image has {len(data)} bytes; this server takes at most {max_bytes}", param=param)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # (bounded below, more tightly)
            image = Image.open(io.BytesIO(data), formats=tuple(FORMATS))
            width, height = image.size
            if width * height > max_pixels:  # from the header: nothing decoded yet
                raise PromptTooLarge(
                    f"an image is {width}x{height} pixels; this server takes at most {max_pixels} pixels an image",
                    param=param,
                )
            if getattr(image, "is_animated", False):  # (a second frame's header: the rest are not read)
                raise InvalidRequest(
                    "an image is animated (several frames); send a still image (PNG, JPEG, WebP or GIF)", param=param
                )
            image.load()  # decoded whole: a truncated or corrupt file fails here
    except (PromptTooLarge, InvalidRequest):
        raise
    except Image.DecompressionBombError:  # (Pillow's own bound, past twice its default: 179 M pixels)
        raise PromptTooLarge("an image decodes to more pixels than this server takes", param=param) from None
    except Exception:  # not an image of an accepted format, truncated, corrupt
        accepted = ", ".join(FORMATS)
        raise InvalidRequest(f"an image could not be read: it must be a whole {accepted} file", param=param) from None
    mime = FORMATS[str(image.format)]
    if p.mime is not None and p.mime != mime:
        raise InvalidRequest(f"an image's data: URL says {p.mime!r}, but the image is {mime}", param=param)
    return p.model_copy(update={"mime": mime, "width": width, "height": height})
