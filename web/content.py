"""A message's content as requests send it: a string, or parts of text and images (OpenAI's chat shape), read into
the text and the images a job's message holds (tasks/images.py reads and bounds each image)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks.errors import InvalidRequest
from tasks.images import assemble
from tasks.job import Picture

STRICT = ConfigDict(extra="forbid", strict=True)


class TextPart(BaseModel):
    model_config = STRICT

    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    model_config = STRICT

    url: str = Field(
        description="a data: URL (data:image/png;base64,…), or an http(s) URL, which the server fetches only from the "
        "hosts its operator lists (ONELANE_IMAGE_HOSTS; none by default, and any other is refused)"
    )
    detail: Literal["auto", "low", "high"] | None = None  # (the model reads the image as its processor sizes it)


class ImagePart(BaseModel):
    """An image in a user's message, for a model that reads images."""

    model_config = STRICT

    type: Literal["image_url"]
    image_url: ImageURL


Content = str | list[TextPart | ImagePart]


def read_content(content: Content | None, role: str, param: str) -> tuple[str, tuple[Picture, ...]]:
    """A message's text, and its images in place (only a user's message may hold any)."""
    if content is None or isinstance(content, str):
        return content or "", ()
    parts = [("text", p.text) if isinstance(p, TextPart) else ("image", p.image_url.url) for p in content]
    text, images = assemble(parts, param)
    if images and role != "user":
        raise InvalidRequest("only a user's message may hold images", param=param)
    return text, images
