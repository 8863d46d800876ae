"""Python and Lua name what crosses between them once: each script's arguments (tasks/scripts.py ARGS) and the
constants written into every script (key names, shared facts). A script that reads an argument its entry does not
list, or leaves one unread, or uses a constant that is not written into it, fails here; a call that names an
argument the entry does not list fails before anything is sent."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from tasks.scripts import ARGS, CONSTANTS, ordered, prelude
from web.health import COUNTERS, HISTOGRAMS, REJECTED

LUA = resources.files("tasks") / "lua"


def code(name: str) -> str:
    """A script's code without its comments and string literals."""
    text = (LUA / f"{name}.lua").read_text()
    text = re.sub(r"--[^\n]*", "", text)
    return re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "''", text)


@pytest.mark.parametrize("name", sorted(ARGS))
def test_each_script_reads_exactly_the_arguments_its_entry_names(name: str) -> None:
    read = set(re.findall(r"\bARG\.([A-Za-z_]\w*)", code(name)))
    assert read == {arg.lstrip("*") for arg in ARGS[name]}


def test_every_script_has_an_entry_and_every_entry_a_script() -> None:
    shared = {"common", "images"}  # (written into every script)
    scripts = {p.name.removesuffix(".lua") for p in LUA.iterdir() if p.name.endswith(".lua")} - shared
    assert scripts == set(ARGS)


def test_every_constant_the_scripts_use_is_written_into_them() -> None:
    everything = "\n".join(code(p.name.removesuffix(".lua")) for p in LUA.iterdir() if p.name.endswith(".lua"))
    defined = set(re.findall(r"\blocal\s+([A-Z][A-Z0-9_]+)\s*=", everything))
    used = set(re.findall(r"\b([A-Z][A-Z0-9_]+)\b", everything)) - {"ARG", "ARGV", "KEYS"}
    assert used - defined <= set(CONSTANTS), used - defined - set(CONSTANTS)
    assert set(CONSTANTS) - used == set(), "a constant no script uses"


def test_a_call_that_names_an_argument_the_entry_does_not_list_is_refused() -> None:
    with pytest.raises(TypeError, match="unknown \\['ownr'\\]"):
        ordered("cancel", {"id": "j", "ownr": "me", "result_ttl_s": 1, "error": ""})
    with pytest.raises(TypeError, match="missing \\['error'\\]"):
        ordered("cancel", {"id": "j", "owner": "me", "result_ttl_s": 1})
    assert ordered("position", {"limit": 4, "ids": ["a", "b"]}) == [4, "a", "b"]


def test_every_constant_reads_in_lua_as_python_has_it(redis_client) -> None:  # type: ignore[no-untyped-def]
    names = list(CONSTANTS)
    got = redis_client.eval(prelude("watch") + "return {" + ", ".join(f"tostring({n})" for n in names) + "}", 0)
    assert dict(zip(names, got)) == {n: str(v) for n, v in CONSTANTS.items()}


def test_the_counters_the_scripts_write_are_the_ones_metrics_reads() -> None:
    # What the scripts count into keys.STATS (and the worker's processes, through Upkeep.count), by name...
    text = "\n".join((LUA / p.name).read_text() for p in LUA.iterdir() if p.name.endswith(".lua"))
    written = set(re.findall(r"\bstat\('([\w:]+)'[,)]", text)) | set(re.findall(r"STATS, '(\w+)'", text))
    written |= {f"h:{name}" for name in re.findall(r"\bobserve\('(\w+)'", text)}
    python = Path(__file__).parent.parent
    written |= set(
        re.findall(r'upkeep\.count\("(\w+)"\)', "".join(p.read_text() for p in python.glob("worker/**/*.py")))
    )
    # ... and what /metrics reads (web/health.py), by name: each one the other side knows
    read = {field for _, field in COUNTERS.values()} | {f"rejected:{r}" for r in REJECTED}
    read |= {f"h:{name}" for name in HISTOGRAMS}
    dynamic = {"h", "finished", "model_tokens", "model_finished"}  # prefixes with a name or status after them
    assert {w for w in written if w.split(":")[0] not in dynamic or w.startswith("h:")} == read
    assert "cache_lookups" in written and "rejected:queue_full" in written  # (the patterns read the scripts)
