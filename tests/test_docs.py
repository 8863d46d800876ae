"""The documentation keeps up with the code: the configuration page names every setting the code reads, exactly once,
with its default and its bounds; every relative link in the README and docs/, and every file of the repository they
cite, leads somewhere; and the examples name served models, call the installed SDKs with arguments they take, and
pause between polls."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasks.catalogue import DEFAULT_MODEL, DEMO_MODEL
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


# --- what the pages cite and show -------------------------------------------------------------------------------

#: a file or folder of the repository a page cites (`worker/batch/forward.py`, `tests/test_docs.py`, `../x`)
CITED = re.compile(r"(?<![\w./-])((?:\.\./)+[\w./-]*\w|(?:tasks|web|worker|cli|tests|bench|docs)/[\w./*-]*[\w/*])")
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.S | re.M)


def code_blocks(page: Path) -> Iterator[tuple[int, str, str]]:
    """Each fenced block of a page: (its first line's number, its language, its text, unindented)."""
    text = page.read_text()
    for match in FENCE.finditer(text):
        indent = len(match.group(1))
        body = "\n".join(line[indent:] for line in match.group(3).splitlines())
        yield text[: match.start()].count("\n") + 1, match.group(2), body


def cited_exists(page: Path, cited: str) -> bool:
    """A path as a page cites it: relative to the page when it climbs (`../`), else to the repository; a glob
    (`lua/*.lua`), or a module's attribute (`bench/harness.generate`: bench/harness.py), counts if it finds one."""
    base = page.parent if cited.startswith("..") else ROOT
    if "*" in cited:
        return any(base.glob(cited))
    path = (base / cited).resolve()
    return path.exists() or path.with_suffix(".py").exists()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_file_a_page_cites_is_in_the_repository(page):
    for number, line in enumerate(page.read_text().splitlines(), 1):
        for match in CITED.finditer(line):
            if re.match(r"`? \(now ", line[match.end() :]):  # a former name, with the one it has now
                continue
            assert cited_exists(page, match.group(1)), f"{page.name}:{number}: {match.group(1)} is not in a clone"
        for bench in re.findall(r"dev\.sh bench ([a-z_]+)", line):  # (the benchmarks a page tells to run)
            assert (ROOT / "bench" / f"{bench}.py").exists(), f"{page.name}:{number}: no benchmark {bench}"


def served_names() -> set[str]:
    """The models a fresh install serves, and those the pages' models files name (`[models.NAME]`)."""
    names = {DEFAULT_MODEL, DEMO_MODEL}
    for page in PAGES:
        for _, language, body in code_blocks(page):
            if language == "toml":
                names |= set(re.findall(r"^\[models\.([\w.-]+)\]", body, re.M))
    return names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_model_an_example_sends_is_one_the_server_serves(page):
    served = served_names()
    for number, language, body in code_blocks(page):
        if language not in ("python", "sh", "console"):
            continue
        sent = re.findall(r"""\bmodel\s*=\s*["']([^"']+)["']|"model":\s*"([^"]+)"|--model\s+([\w./-]+)""", body)
        for name in ("".join(groups) for groups in sent):
            assert "/" in name or name in served, (  # (a Hugging Face id is served once it is named)
                f"{page.name}:{number}: the example sends model {name!r}, which is not served: {sorted(served)}"
            )


def sdk_clients() -> dict[str, Any]:
    """The official clients as the examples build them (no request is made)."""
    import anthropic
    import openai

    return {
        "anthropic": anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key="unused"),
        "openai": openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused"),
    }


def python_examples(page: Path) -> Iterator[tuple[int, ast.Module, str | None]]:
    """Each Python example of a page, parsed, with the SDK its `client` is (an example that imports none goes on
    from the one before, as the pages write them)."""
    sdk = None
    for number, language, body in code_blocks(page):
        if language != "python":
            continue
        tree = ast.parse(body)
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
        }
        sdk = next((name for name in ("anthropic", "openai") if name in imported), sdk)
        yield number, tree, sdk


def called_on(node: ast.Call, root: str) -> list[str] | None:
    """`client.messages.create(...)` -> ["messages", "create"] (None: not a call of an attribute of `root`)."""
    chain, func = [], node.func
    while isinstance(func, ast.Attribute):
        chain.insert(0, func.attr)
        func = func.value
    return chain if isinstance(func, ast.Name) and func.id == root and chain else None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_sdk_call_an_example_makes_takes_its_arguments(page):
    clients = sdk_clients()
    for number, tree, sdk in python_examples(page):
        for node in ast.walk(tree):
            chain = called_on(node, "client") if isinstance(node, ast.Call) and sdk else None
            if chain is None:
                continue
            method: Any = clients[sdk or ""]
            for name in chain:
                method = getattr(method, name)
            parameters = inspect.signature(method).parameters
            if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
                continue
            for keyword in (k.arg for k in node.keywords if k.arg is not None):
                assert keyword in parameters, (
                    f"{page.name}:{number}: the installed {sdk} SDK's {'.'.join(chain)} takes no {keyword!r}"
                    + (" (send it in extra_body)" if sdk == "anthropic" else "")
                )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_example_that_polls_pauses_between_polls(page):
    for number, tree, _ in python_examples(page):
        for loop in (node for node in ast.walk(tree) if isinstance(node, ast.While)):
            calls = {
                call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
                for call in ast.walk(loop)
                if isinstance(call, ast.Call)
            }
            assert "retrieve" not in calls or "sleep" in calls, f"{page.name}:{number}: a loop polls without a pause"
