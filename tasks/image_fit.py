"""How large an image a model reads: its processor's size, read from its folder (preprocessor_config.json), so that
the door stores no image much larger than the model will see (tasks/image_reader.py downscales one past it).

The web reads the file; it never imports mlx-vlm. A processor resizes each image its own way: to a fixed height and
width (Gemma 3, SigLIP: `size` {height, width}), its shortest edge to a length (CLIP, LLaVA: `shortest_edge`), its
longest edge (Idefics3, SmolVLM: `longest_edge`), or its area to at most a number of pixels (Qwen2-VL: `max_pixels`).
The door keeps every image within SLACK times that (twice each length), so the processor still makes the final
resize itself, its way, from more pixels than it keeps; an image already within it goes on as it came, byte for
byte. A processor whose size cannot be read: the longest edge at most UNKNOWN_EDGE pixels.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

SLACK = 2  # the door's bound: each of the processor's lengths, times this
UNKNOWN_EDGE = 2048  # the longest edge kept for a processor whose size cannot be read

Rule = Literal["cover", "shortest", "longest", "pixels"]


@dataclass(frozen=True)
class Fit:
    """A processor's size: `cover` (width a, height b: both edges kept at least that), `shortest` (edge a), `longest`
    (edge a), or `pixels` (area a)."""

    rule: Rule
    a: int
    b: int = 0

    def size(self, width: int, height: int) -> tuple[int, int] | None:
        """The size an image of width x height is brought down to (within SLACK times the processor's size), or None
        if it is within it already. Never up."""
        if self.rule == "cover":
            scale = max(SLACK * self.a / width, SLACK * self.b / height)
        elif self.rule == "shortest":
            scale = SLACK * self.a / min(width, height)
        elif self.rule == "longest":
            scale = SLACK * self.a / max(width, height)
        else:
            scale = SLACK * math.sqrt(self.a / (width * height))
        if scale >= 1:
            return None
        return max(1, round(width * scale)), max(1, round(height * scale))

    def json(self) -> list[Any]:
        return [self.rule, self.a, self.b]

    @classmethod
    def of_json(cls, value: list[Any]) -> Fit:
        return cls(value[0], int(value[1]), int(value[2]))


UNKNOWN = Fit("longest", UNKNOWN_EDGE // SLACK)


def fit_of(path: str) -> Fit:
    """The size the model at `path` (a folder, or a hub id already downloaded) reads images at; UNKNOWN if it
    cannot be read."""
    return _fit(str(Path(path).expanduser()))


@lru_cache(maxsize=64)
def _fit(path: str) -> Fit:
    config = _processor_config(path)
    if not isinstance(config, dict):
        return UNKNOWN
    size, kind = config.get("size"), str(config.get("image_processor_type", "")).lower()
    edges = size if isinstance(size, dict) else {}
    pixels = _length(config.get("max_pixels"))
    if "qwen" in kind:  # (Qwen2-VL's processors name their bounds on area so)
        pixels = pixels or _length(edges.get("longest_edge"))
    width, height = _length(edges.get("width")), _length(edges.get("height"))
    shortest, longest = _length(size) or _length(edges.get("shortest_edge")), _length(edges.get("longest_edge"))
    if pixels:
        return Fit("pixels", pixels)
    if width and height:
        return Fit("cover", width, height)
    if shortest:
        return Fit("shortest", shortest)
    if longest:
        return Fit("longest", longest)
    return UNKNOWN


def _processor_config(path: str) -> Any:
    folder = Path(path)
    if not folder.is_dir():  # a hub id: its files if downloaded already (the web never downloads)
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(path, "preprocessor_config.json")
        except Exception:  # (not a hub id, or no such cache)
            return None
        return _read(Path(found)) if isinstance(found, str) else None
    config = _read(folder / "preprocessor_config.json")
    if config is None:  # (some keep it in processor_config.json, under image_processor)
        processor = _read(folder / "processor_config.json")
        config = processor.get("image_processor") if isinstance(processor, dict) else None
    return config


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _length(value: Any) -> int | None:
    """`value` if it is a length (a positive integer)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
