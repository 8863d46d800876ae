"""The Lua scripts of tasks/lua/, and the one table of what each one takes.

Nothing crosses from Python to Lua by position. Each script reads its arguments by name, as `ARG.<name>`, and the
key names and other shared facts as constants (`JOB`, `QUEUE`, `MINUTE_TTL`, ...): both come from a prelude
written here, from ARGS and CONSTANTS, in front of tasks/lua/images.lua, tasks/lua/common.lua and the script. A
caller passes the arguments by name too (`Scripts.run("cancel", id=..., owner=...)`), and a name the table does not list for that
script, or one it lists and the call leaves out, is a TypeError before anything is sent. tests/test_scripts.py
reads every script and fails on a name it uses that its entry does not list, or one listed that it never uses.
An entry's last name may start with `*`: the arguments from there on, as a Lua list.
"""

from __future__ import annotations

from enum import IntEnum
from importlib import resources
from typing import Any

import redis

from tasks import keys, scheduling
from tasks.broker import Doorbell

BELL = ("bell_queue", "bell_messages", "bell_id", "bell")  # a job's dramatiq message: see tasks/broker.py Doorbell

#: Each script's arguments, by name, in the order they are sent.
ARGS: dict[str, tuple[str, ...]] = {
    "admit": ("owner", "ttl_s", "result_ttl_s", "watch_grace_s", "max_queue", "max_per_user", "max_tokens", *BELL,
              "model", "class", "share", "prompt_weight", "output_weight", "visitors", "max_visitors", "history", "line", "side", "ignore_eos", "prompt_chars", "counted",
              "history_chars", "images", "image_upload", "image_need_s", "image_keep_s", "max_user_image_bytes",
              "max_image_bytes", "*jobs"),
    "append": ("id", "text", "prompt_tokens", "worker", "from_n", "from_b", "cached_tokens", "ids", "lp", "prompt_lp"),
    "cancel": ("id", "owner", "result_ttl_s", "error"),
    "claim": ("result_ttl_s", "run_life_s", "device", "worker", "token", "want", "active", "switch_wait_s",
              "affinity_s", "urgent", "*loaded"),
    "drop_lease": ("device", "field", "value", "died"),
    "failed_models": ("retry_s", "result_ttl_s", "max_deaths", "*models"),
    "finish": ("id", "status", "finish_reason", "error", "prompt_tokens", "completion_tokens", "result_ttl_s",
               "worker", "stop_seen_at", "cached_tokens", "history", "stop_sequence",
               "proposed_tokens", "accepted_tokens"),
    "housekeep": ("max_attempts", "ttl_s", "result_ttl_s", "limit", *BELL),
    "keep_lease": ("device", "worker", "lease_ms", "hung"),
    "live": ("id",),
    "lease": ("device", "worker", "pid", "lease_ms", "mode", "batch", "slots", "tok_s", "steps", "decode_s",
              "prefill_s", "prefill_tokens", "models", "active", "loading", "cache_lookups", "cache_hits",
              "cache_tokens", "cache_disk_hits", "cache_disk_tokens", "cache_bytes", "cache_entries", "pace", "step_s", "step_limit_s"),
    "model_failed": ("model", "message", "retry_s", "result_ttl_s", "worker"),
    "model_state": ("model", "device", "worker", "*fields"),
    "position": ("limit", "*ids"),
    "recover": ("max_attempts", "ttl_s", "result_ttl_s", "id", "worker", "why", "shared"),
    "ring": BELL,
    "stall": ("device", "stall_s", "result_ttl_s"),
    "watch": ("id",),
}  # fmt: skip


class AppendReply(IntEnum):
    """What append.lua answers."""

    GO_ON = 0
    STOP = 1  # cancelled, or no longer this worker's
    GAP = 2  # it did not follow what Redis holds of the output: nothing appended


class FinishReply(IntEnum):
    """What finish.lua answers."""

    ENDED = 1  # now, or before, so
    NOT_HERE = 0  # it was not running on this worker
    NOT_ASKED = -1  # `cancelled`, which nobody asked for: not ended


#: The facts the scripts share with Python: every key name and prefix, and the bounds kept with them (tasks/keys.py),
#: the scheduling rules' constants (tasks/scheduling.py), and the scripts' replies by name (APPENDED_STOP, ...).
REPLIES: dict[str, type[IntEnum]] = {"APPENDED": AppendReply, "FINISHED": FinishReply}
CONSTANTS: dict[str, str | int] = {
    **keys.LUA_NAMES,
    "LOOK_AHEAD": scheduling.LOOK_AHEAD,
    **{f"{prefix}_{r.name}": int(r) for prefix, reply in REPLIES.items() for r in reply},
}


def bell(doorbell: Doorbell | None) -> dict[str, str | bytes]:
    """A doorbell as the scripts take it (BELL): queue key, hash key, message id, payload ('' for none)."""
    if doorbell is None:
        return dict.fromkeys(BELL, "")
    return dict(zip(BELL, (doorbell.queue_key, doorbell.messages_key, doorbell.message_id, doorbell.payload)))


def prelude(name: str) -> str:
    """The Lua that defines CONSTANTS and the script's ARG table, from ARGV in ARGS' order."""
    lines = [f"local {const} = {lua_literal(value)}" for const, value in CONSTANTS.items()]
    fields = []
    for n, arg in enumerate(ARGS[name], start=1):
        if arg.startswith("*"):
            fields.append(f"[{lua_literal(arg[1:])}] = {{unpack(ARGV, {n})}}")
        else:
            fields.append(f"[{lua_literal(arg)}] = ARGV[{n}]")
    lines.append("local ARG = {" + ", ".join(fields) + "}")
    return "\n".join(lines) + "\n"


def lua_literal(value: str | int) -> str:
    """A Lua 5.1 literal of `value`: a number, or a string whose bytes other than printable ASCII are escaped
    (`\\ddd`: Lua 5.1 knows no `\\u`)."""
    if isinstance(value, int):
        return str(value)
    plain = (chr(b) if 32 <= b < 127 and chr(b) not in "\\'\"" else f"\\{b}" for b in value.encode())
    return '"' + "".join(plain) + '"'


def source(name: str) -> str:
    """The whole text Redis runs for the script `name`."""
    folder = resources.files("tasks") / "lua"
    shared = (folder / "images.lua").read_text() + (
        folder / "common.lua"
    ).read_text()  # (common's finish lets images go)
    return prelude(name) + shared + (folder / f"{name}.lua").read_text()


def _layout(names: tuple[str, ...]) -> tuple[tuple[str, ...], str | None, frozenset[str]]:
    """A script's fixed arguments, its rest (None), and every name it takes."""
    rest = names[-1][1:] if names[-1].startswith("*") else None
    fixed = names[:-1] if rest else names
    return fixed, rest, frozenset(fixed) | ({rest} if rest else frozenset())


LAYOUTS = {name: _layout(names) for name, names in ARGS.items()}


def ordered(name: str, args: dict[str, Any]) -> list[Any]:
    """The arguments of a call to `name`, in the order ARGS gives (a name missing or unknown: TypeError)."""
    fixed, rest, wanted = LAYOUTS[name]
    if args.keys() != wanted:
        missing, unknown = sorted(wanted - args.keys()), sorted(args.keys() - wanted)
        raise TypeError(f"script {name}: missing {missing}, unknown {unknown}")
    values = [args[n] for n in fixed]
    return values + list(args[rest]) if rest else values


class Scripts:
    """The scripts, registered with one Redis client; run by name, with their arguments by name."""

    def __init__(self, client: redis.Redis) -> None:
        self._scripts = {name: client.register_script(source(name)) for name in ARGS}
        self.redis = client

    def run(self, name: str, pipe: Any = None, **args: Any) -> Any:
        """Run a script now, or queue it on `pipe` (a pipeline: its reply comes with the pipeline's). On a pipeline
        it goes by its SHA alone: redis-py would otherwise ask SCRIPT EXISTS first, a round trip per pipeline. If
        Redis lost it (NoScriptError in the reply), `load` and send it again: it did not run."""
        script, values = self._scripts[name], ordered(name, args)
        if pipe is not None:
            return pipe.evalsha(script.sha, 0, *values)
        return script(keys=[], args=values)

    def load(self) -> None:
        """Load every script into Redis again (after a restart or SCRIPT FLUSH)."""
        for script in self._scripts.values():
            script.sha = self.redis.script_load(script.script)
