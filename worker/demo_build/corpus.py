"""The demo model's training text: the English prose of Python's own `pydoc_data.topics`.

Every CPython ships it (the help() pages of the language reference, under the PSF license), so the demo model
trains offline on any machine. Code, grammar and tables are indented or boxed there, and are left out here.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

_UNDERLINE = re.compile(r"^([*=\-~^])\1{2,}$")  # the line under a heading
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")
_CODE_MARKS = set("=<>+%{}\\@~^&|#")  # what only code, doctests, grammar rules and tables hold
_WORD_EDGES = "\"'()[]{}<>.,;:!?*`“”‘’"
# ASCII apostrophes; no "quotes" nor *stars* (how the help pages mark code and emphasis): plainer English to learn
_PLAIN = str.maketrans({"’": "'", "‘": "'", "“": None, "”": None, '"': None, "*": None})


@dataclass(frozen=True)
class Section:
    """One heading of the help pages and the prose paragraphs under it, each on one line."""

    title: str
    paragraphs: tuple[str, ...]


def _is_prose(paragraph: str) -> bool:
    # prose ends its sentences and is mostly letters; code, doctests, grammar rules, tables and operators are not
    if _CODE_MARKS & set(paragraph) or not paragraph.endswith((".", ":")):
        return False
    letters = sum(c.isalpha() or c.isspace() for c in paragraph)
    return len(paragraph.split()) >= 4 and letters >= 0.85 * len(paragraph)


def _sections(page: str) -> list[Section]:
    sections, title = [], ""
    paragraphs: list[str] = []
    for block in re.split(r"\n\s*\n", page):
        lines = textwrap.dedent(block.strip("\n")).rstrip().split("\n")
        if len(lines) == 2 and _UNDERLINE.match(lines[1].strip()):
            if paragraphs:
                sections.append(Section(title, tuple(paragraphs)))
            title, paragraphs = " ".join(lines[0].translate(_PLAIN).split()), []
        elif _is_prose(text := "\n".join(lines).translate(_PLAIN)):
            paragraphs.append(" ".join(text.split()))
    if paragraphs:
        sections.append(Section(title, tuple(paragraphs)))
    return sections


def sections() -> list[Section]:
    """The prose of every help page, in the order of its topics."""
    from pydoc_data.topics import topics

    return [section for name in sorted(topics) for section in _sections(topics[name])]


def sentences(paragraph: str) -> list[str]:
    """A paragraph cut into sentences (well enough for prose that rarely abbreviates)."""
    return _SENTENCE_END.split(paragraph)


def words(text: str) -> list[str]:
    """The whitespace-separated words of `text`, lowercased, without surrounding punctuation (empty ones dropped)."""
    return [w for w in (raw.strip(_WORD_EDGES).lower() for raw in text.split()) if w]


def vocabulary() -> set[str]:
    """Every word of the corpus, as `words` spells it."""
    return {w for s in sections() for text in (s.title, *s.paragraphs) for w in words(text)}
