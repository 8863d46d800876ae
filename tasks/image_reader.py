"""The image reader's own process: reads each image a request brings, checks it and makes it what the model reads,
away from the web's loop (tasks/images.py asks it, as tasks/children.py runs its children).

Decoding an image is CPU work in native code: done in the web it held every stream of its process (a JPEG of
20,000 scans held /healthz for 57-93 s), and a decoder that crashes or runs away must cost one request its 400, not
the web process. Here each request has CPU_S of CPU time (past it the kernel ends the process) and the process at
most MEMORY_BYTES of address space; the web also gives up on one that takes READ_S (tasks/images.py).

A request (tasks/children.py's wire) is `{"mime": the type its data: URL declares or null, "max_pixels": n, "fit":
the model's processor's size (tasks/image_fit.py)}` and the image's bytes; the answer is `{"status": 400 | 413,
"message": why}`, or `{"mime", "width", "height", "changed"}` with, when `changed`, the image to keep instead (as
PNG). An image is checked, in this order, before its pixels are decoded:
- its format, one of FORMATS, the one its data: URL says;
- its size, width x height at most max_pixels, read from its header;
- a still image: an animated GIF or WebP is refused (as OpenAI's API takes "non-animated GIF" only);
- a JPEG holds at most MAX_SCANS scans, counted from its markers: a progressive JPEG is read in scans, and each
  costs the decoder a pass over every block of the image, however few bytes it has (a crafted one of 726 KB held
  20,000, over 4096 x 4096 pixels). libjpeg's own progressive JPEGs have 10 scans (6 grayscale), and encoders that
  tune their scans (mozjpeg) write a few more; MAX_SCANS of them cost a 4096 x 4096 image under a second here;
- then it decodes whole (a truncated or corrupt file is a 400, not the worker's failure).
Then it is made what the model reads, once: turned upright by its EXIF orientation (a photo taken sideways, as
mlx-vlm's load_image turns it), a 16-bit grayscale PNG scaled to 8 bits (Pillow's convert("RGB") would clip it to
white), and brought down to the model's processor's size (tasks/image_fit.py). An image that needs none of these
goes on as it came, byte for byte, so that the model reads what mlx-vlm would; one that does is kept as a PNG.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

from tasks.children import serve
from tasks.image_fit import Fit

FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
MAX_SCANS = 100
CPU_S = 10  # one image's CPU time, at most (a 4096 x 4096 photo decodes and shrinks in about a second here)
MEMORY_BYTES = 2 * 1024**3  # address space: a 100-megapixel image decodes within it, with room for its copies
SIXTEEN_BITS = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # Pillow's modes of a 16-bit grayscale image
KEPT_MODES = ("L", "LA", "RGB", "RGBA")  # what a changed image is kept as (others are converted: P, CMYK, 1...)
ORIENTATION = 0x0112  # EXIF's tag


class Refusal(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def main() -> None:
    serve(_handle, memory_bytes=MEMORY_BYTES, cpu_s=CPU_S)


def _handle(header: dict[str, Any], data: bytes) -> tuple[dict[str, Any], bytes]:
    try:
        return read(data, header.get("mime"), int(header["max_pixels"]), Fit.of_json(header["fit"]))
    except Refusal as refusal:
        return {"status": refusal.status, "message": refusal.message}, b""
    except MemoryError:
        return {"status": 413, "message": "an image is too large to read within this server's memory bound"}, b""


def read(data: bytes, declared: str | None, max_pixels: int, fit: Fit) -> tuple[dict[str, Any], bytes]:
    """The image `data` checked and made what the model reads (see the module's docstring), or Refusal."""
    from PIL import Image

    accepted = ", ".join(FORMATS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # (bounded below, more tightly)
        try:
            image = Image.open(io.BytesIO(data), formats=tuple(FORMATS))
        except Image.DecompressionBombError:  # (Pillow's own bound, past twice its default: 179 M pixels)
            raise Refusal(413, "an image decodes to more pixels than this server takes") from None
        except Exception:
            raise Refusal(400, f"an image could not be read: it must be a whole {accepted} file") from None
        width, height = image.size
        if width * height > max_pixels:  # from the header: nothing decoded yet
            raise Refusal(
                413, f"an image is {width}x{height} pixels; this server takes at most {max_pixels} pixels an image"
            )
        if getattr(image, "is_animated", False):  # (a second frame's header: the rest are not read)
            raise Refusal(400, "an image is animated (several frames); send a still image (PNG, JPEG, WebP or GIF)")
        mime = FORMATS[str(image.format)]
        if declared is not None and declared != mime:
            raise Refusal(400, f"an image's data: URL says {declared!r}, but the image is {mime}")
        if image.format == "JPEG" and jpeg_scans(data, MAX_SCANS) > MAX_SCANS:
            raise Refusal(
                400,
                f"a JPEG holds more than {MAX_SCANS} scans; this server reads at most {MAX_SCANS} (a progressive "
                "JPEG's encoder writes about 10): send it as a baseline JPEG, or a PNG",
            )
        try:
            image.load()  # decoded whole: a truncated or corrupt file fails here
        except Image.DecompressionBombError:
            raise Refusal(413, "an image decodes to more pixels than this server takes") from None
        except MemoryError:
            raise
        except Exception:
            raise Refusal(400, f"an image could not be read: it must be a whole {accepted} file") from None
    made = _as_read(image, fit)
    if made is None:
        return {"mime": mime, "width": width, "height": height, "changed": False}, b""
    out = io.BytesIO()
    made.save(out, "PNG", compress_level=1)  # (fast: it is kept for a while, not for ever)
    return {"mime": "image/png", "width": made.width, "height": made.height, "changed": True}, out.getvalue()


def _as_read(image: Any, fit: Fit) -> Any:
    """The image as the model should read it: upright, 8 bits, within the processor's size; None if it is so."""
    from PIL import Image, ImageOps

    changed = False
    if image.getexif().get(ORIENTATION, 1) in range(2, 9):
        image, changed = ImageOps.exif_transpose(image), True
    if image.mode in SIXTEEN_BITS:  # 0-65535 to 0-255, rounded (not clipped)
        image, changed = image.convert("I").point(lambda v: v * (255 / 65535) + 0.5).convert("L"), True
    size = fit.size(image.width, image.height)
    if size is None and not changed:
        return None
    if image.mode not in KEPT_MODES:
        alpha = image.mode in ("PA", "RGBa") or "transparency" in image.info
        image = image.convert("RGBA" if alpha else "RGB")
    if size is not None:
        image = image.resize(size, Image.Resampling.LANCZOS, reducing_gap=2.0)
    return image


def jpeg_scans(data: bytes, most: int) -> int:
    """How many scans (SOS segments) a JPEG holds, counted from its markers, up to `most` + 1 (no need to read on).
    A file whose markers do not follow one another is counted as far as they do: its decoding refuses it."""
    i, scans, end = 2, 0, len(data)
    while i + 1 < end and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF:  # (fill bytes before a marker)
            i += 1
            continue
        if marker == 0xD9:  # end of image
            break
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # markers without a length
            i += 2
            continue
        if i + 4 > end:
            break
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
        if marker != 0xDA:
            continue
        scans += 1
        if scans > most:
            break
        while (i := data.find(b"\xff", i)) >= 0 and i + 1 < end:  # the scan's data: to the next real marker
            after = data[i + 1]
            if after != 0 and not 0xD0 <= after <= 0xD7:  # (not a stuffed 0xFF, nor a restart)
                break
            i += 2
        if i < 0:
            break
    return scans


if __name__ == "__main__":
    main()
