"""The documentation keeps up with the code: the configuration page names every setting the code reads, exactly once,
with its default and its bounds, and every relative link in the README and docs/ leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tasks.settings import ENV_NAMES, RETIRED, Settings

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIG = ROOT / "docs" / "configuration.md"
READ_BY_CODE = re.compile(r"\bONELANE_[A-Z_]+\b")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
UNITS = {2**50: "PiB", 2**40: "TiB", 2**30: "GiB", 2**20: "MiB", 2**10: "KiB"}


def settings_read_by_the_code() -> set[str]:
    """Every ONELANE_* variable the code reads: the server's settings, and those of the client and of dev.sh."""
    names = {name for name in ENV_NAMES.values() if name.startswith("ONELANE_")}
    for folder in ("tasks", "web", "worker", "cli"):
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(READ_BY_CODE.findall(path.read_text()))
    names |= set(READ_BY_CODE.findall((ROOT / "dev.sh").read_text()))
    return names - set(RETIRED)


def rows() -> dict[str, list[str]]:
    """The configuration page's table rows, by the variable each names first: (its rows' cells)."""
    found: dict[str, list[str]] = {}
    for line in CONFIG.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `") else []
        if cells:
            name = cells[0].strip("`")
            assert name not in found, f"{name} is named by two rows of docs/configuration.md"
            found[name] = cells
    return found


def spellings(value: float) -> set[str]:
    """The ways a number may be written on the page: 600, 600.0, 10,000,000, 32 MiB."""
    shown = {str(value), f"{value:g}", f"{value:,}"}
    if float(value).is_integer():
        n = int(value)
        shown |= {str(n), f"{n:,}"}
        shown |= {f"{n // unit} {name}" for unit, name in UNITS.items() if n >= unit and n % unit == 0}
    return shown


def test_the_configuration_page_names_every_setting_exactly_once():
    documented = {name for name in rows() if name.startswith("ONELANE_")}
    assert documented == settings_read_by_the_code()


@pytest.mark.parametrize("field", [f for f, env in ENV_NAMES.items() if env.startswith("ONELANE_")])
def test_each_setting_is_documented_with_its_default_and_bounds(field):
    row = rows()[ENV_NAMES[field]]
    info = Settings.model_fields[field]
    default = info.default
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        assert any(f"`{s}`" in row[1] for s in spellings(default)), (
            f"{ENV_NAMES[field]}: default {default} not in {row[1]!r}"
        )
    for bound in info.metadata:
        for kind in ("ge", "gt", "le", "lt"):
            value = getattr(bound, kind, None)
            if value is None or (kind == "gt" and value == 0 and "above 0" in row[-1]):
                continue
            text = " ".join(row[1:])
            assert any(s in text for s in spellings(value)), (
                f"{ENV_NAMES[field]}: its bound {kind} {value} is not in its row"
            )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    fence = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):  # https:, mailto:: not ours to check
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.exists(), f"{page.name}:{number}: {target} leads nowhere"
            if anchor:
                assert anchor in anchors(file), f"{page.name}:{number}: {file.name} has no heading #{anchor}"


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    found, fence = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        if not fence and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found
