"""Real agent clients, unchanged, against a running onelane (issue 50): Claude Code's headless mode (`claude -p`, the
Messages API) and Codex CLI (`codex exec`, the Responses API), the versions ./dev.sh installs from npm into
.tools/agents, each run as a subprocess in a folder holding one file. The model is tests/agent_model.py's, trained
here in seconds: it calls the client's shell tool to run `ls`, then, reading the result, answers. So each story is
an agent's whole round trip: the client's request, onelane's tool call, the client running the command, the result
sent back, and onelane's answer."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tasks.job import Job, JobStatus
from tasks.settings import Settings
from tasks.store import Store
from tasks.structured import read_calls
from tasks.users import User
from tests import agent_model
from tests.agent_model import ANSWER, CLAUDE_SYSTEM, CODEX_INSTRUCTIONS, TASK

pytestmark = pytest.mark.timeout(300)

CLIENTS = Path(__file__).resolve().parents[1] / ".tools" / "agents" / "node_modules" / ".bin"
KEY = "sk-onelane-agent-story"  # the one user's key: onelane refuses any other
LISTED = "onelane-notes.txt"  # the one file in the folder the client works in
RUN_S = 90  # a client that has not ended by then has hung: it fails the story
#: Claude Code's environment: no telemetry, no update check, no retries (a refusal or an outage fails at once)
QUIET = {"DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}
QUIET |= {"DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_MAX_RETRIES": "0", "API_TIMEOUT_MS": "30000"}


def installed(name: str) -> str:
    """A client that ./dev.sh installed; absent locally -> skip, absent in CI -> fail."""
    path = CLIENTS / name
    if not os.access(path, os.X_OK):
        reason = f"{path}: ./dev.sh test installs it with npm"
        if os.environ.get("CI"):
            pytest.fail(f"CI needs {reason}")
        pytest.skip(reason)
    return str(path)


@pytest.fixture(scope="session")
def claude() -> str:
    return installed("claude")


@pytest.fixture(scope="session")
def codex() -> str:
    return installed("codex")


@pytest.fixture(scope="session")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent model, trained once a session; it must have learnt the stories' turns."""
    path = agent_model.make_agent_model(tmp_path_factory.mktemp("models") / "agent")
    assert agent_model.wrong_answers(path) == {}, "the agent model answers the stories' turns otherwise than it learnt"
    return path


@pytest.fixture
def settings(settings: Settings, agent: Path) -> Settings:
    """The agent model served alone, to one user."""
    return settings.model_copy(update={"model": str(agent), "users": (User(name="agent", key=KEY),)})


@pytest.fixture
def answered(app) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
    """The path and status of every request the live server answers: a client that works around a refusal (Claude
    Code asks again without a field onelane refused) shows none of it."""
    seen: list[tuple[str, int]] = []
    inner = app.wsgi_app

    def record(environ: dict[str, Any], start_response: Any) -> Any:
        def start(status: str, headers: Any, exc_info: Any = None) -> Any:
            seen.append((environ["PATH_INFO"], int(status.split()[0])))
            return start_response(status, headers, exc_info)

        return inner(environ, start)

    app.wsgi_app = record
    return seen


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / LISTED).write_text("hello\n")
    return work


def run(command: list[str], folder: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    """Run a client in `folder` with a home of its own and no credential but onelane's key, nothing on its stdin."""
    home = folder.parent / "home"
    home.mkdir()
    environment = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", **variables}
    return subprocess.run(
        command, cwd=folder, env=environment, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_S
    )


def lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def round_trip(store: Store, name: str) -> tuple[Job, Job]:
    """The agent's jobs: the first asked what the agent model learnt, and there were two, both completed."""
    jobs = list(reversed(store.list("agent")))
    messages, tools = agent_model.conversation(name, TASK)
    assert jobs and (jobs[0].spec.messages, jobs[0].spec.tools) == (messages, tools), (
        f"{name} asked for another prompt than the agent model learnt (a new version? tests/agent_tools.json)"
    )
    assert [j.status for j in jobs] == [JobStatus.COMPLETED] * 2, [(j.status, j.error, j.output) for j in jobs]
    return jobs[0], jobs[1]


def test_claude_code_runs_the_models_command_and_answers_from_its_result(
    claude, start_worker, live_server, settings, store, answered, folder
):
    # Given onelane serving the agent model, and Claude Code pointed at it with the key, allowed to run Bash
    start_worker(served=settings)
    command = [claude, "-p", TASK, "--bare", "--tools", "Bash", "--allowedTools", "Bash"]
    command += ["--system-prompt", CLAUDE_SYSTEM, "--model", settings.model_name, "--max-turns", "2"]
    command += ["--no-session-persistence", "--output-format", "stream-json", "--verbose"]
    # When it runs headless
    done = run(
        command,
        folder,
        ANTHROPIC_BASE_URL=live_server,
        ANTHROPIC_API_KEY=KEY,
        CLAUDE_CODE_MAX_OUTPUT_TOKENS="200",
        **QUIET,
    )
    # Then it ended well, and onelane answered two requests, refusing nothing
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    call, answer = round_trip(store, "claude")
    assert answered == [("/v1/messages", 200)] * 2
    # the model's call ran in the folder, its result went back, and the model's answer ended the turn
    events = lines(done.stdout)
    said = [b for e in events if e["type"] == "assistant" for b in e["message"]["content"]]
    assert [b["type"] for b in said] == ["tool_use", "text"]
    assert (said[0]["name"], said[0]["input"]) == ("Bash", {"command": "ls"})
    results = [b for e in events if e["type"] == "user" for b in e["message"]["content"]]
    assert [(b["type"], b["tool_use_id"], b["is_error"]) for b in results] == [("tool_result", said[0]["id"], False)]
    assert LISTED in results[0]["content"]
    end = events[-1]
    assert (end["type"], end["subtype"], end["is_error"], end["num_turns"]) == ("result", "success", False, 2)
    assert end["result"] == said[1]["text"] == ANSWER
    # as onelane had answered: the call, then, reading its result, the answer
    assert read_calls(call.output, call.spec.constraint) == ("", [("Bash", '{"command":"ls"}')])
    assert said[0]["id"].startswith("toolu_" + call.id.removeprefix("job_")[:16])
    (result,) = [m for m in answer.spec.messages or () if m.role == "tool"]
    assert result.tool_call_id == said[0]["id"] and LISTED in result.content
    assert answer.output == ANSWER


CODEX_CONFIG = """\
model = {model}
model_provider = "onelane"
# its instructions, its shell tool and no other tools: what the agent model learnt
model_instructions_file = {instructions}
include_permissions_instructions = false
include_environment_context = false
web_search = "disabled"

[features]
goals = false
view_image = false

[agents]
enabled = false

[skills]
include_instructions = false

[analytics]
enabled = false

[model_providers.onelane]
name = "onelane"
base_url = {base_url}
wire_api = "responses"
env_key = "ONELANE_API_KEY"
# no retries: a refusal or an outage fails at once
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 30000
"""


def test_codex_cli_runs_the_models_command_and_answers_from_its_result(
    codex, start_worker, live_server, settings, store, answered, folder, tmp_path
):
    # Given onelane serving the agent model, and Codex CLI with a model provider of onelane's /v1 and the key
    start_worker(served=settings)
    home = tmp_path / "codex"
    home.mkdir()
    (home / "instructions.md").write_text(CODEX_INSTRUCTIONS + "\n")
    quoted = {  # (TOML's basic strings are JSON's)
        "model": json.dumps(settings.model_name),
        "instructions": json.dumps(str(home / "instructions.md")),
        "base_url": json.dumps(f"{live_server}/v1"),
    }
    (home / "config.toml").write_text(CODEX_CONFIG.format(**quoted))
    command = [codex, "exec", "--strict-config", "--ephemeral", "--skip-git-repo-check", "--json", TASK]
    # When it runs headless (in its read-only sandbox)
    done = run(command, folder, CODEX_HOME=str(home), ONELANE_API_KEY=KEY)
    # Then it ended well, and onelane answered two requests, refusing nothing
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    call, answer = round_trip(store, "codex")
    assert answered == [("/v1/responses", 200)] * 2
    # the model's call ran in the folder, its result went back, and the model's answer ended the turn
    items = [e["item"] for e in lines(done.stdout) if e["type"] == "item.completed" and e["item"]["type"] != "error"]
    assert [i["type"] for i in items] == ["command_execution", "agent_message"]
    ran, said = items
    assert (ran["command"].split()[-1], ran["exit_code"], ran["status"]) == ("ls", 0, "completed")
    assert LISTED in ran["aggregated_output"]
    assert said["text"] == ANSWER
    assert lines(done.stdout)[-1]["type"] == "turn.completed"
    # as onelane had answered: the call, then, reading its result, the answer
    assert read_calls(call.output, call.spec.constraint) == ("", [("exec_command", '{"cmd":"ls"}')])
    (result,) = [m for m in answer.spec.messages or () if m.role == "tool"]
    assert result.tool_call_id.startswith("call_" + call.id.removeprefix("job_")[:16]) and LISTED in result.content
    assert answer.output == ANSWER


def test_claude_code_with_its_own_prompt_shows_that_the_model_cannot_read_it(
    claude, start_worker, live_server, settings, store, answered, folder
):
    # Given onelane serving the agent model (a context of 8,192 tokens), and Claude Code told nothing of its prompt
    # or its max_tokens: its own system prompt and tools (about 47,000 characters), 32,000 tokens of answer
    start_worker(served=settings)
    command = [claude, "-p", TASK, "--model", settings.model_name, "--max-turns", "1"]
    command += ["--no-session-persistence", "--output-format", "stream-json", "--verbose"]
    # When it runs headless
    done = run(command, folder, ANTHROPIC_BASE_URL=live_server, ANTHROPIC_API_KEY=KEY, **QUIET)
    # Then onelane refused its prompt at once, in Anthropic's words, ran nothing, and Claude Code says why
    assert answered == [("/v1/messages", 400)], answered
    assert store.list("agent") == []
    end = lines(done.stdout)[-1]
    assert (end["type"], end["is_error"]) == ("result", True), done.stdout[-2000:]
    # (Claude Code reads the count and the maximum from Anthropic's words: "Prompt is too long · the request is
    # ~30761 tokens (limit 8191) …")
    assert re.search(r"Prompt is too long\b.* ~?\d+ tokens \(limit 8191\)", end["result"]), end


def test_codex_cli_with_its_own_prompt_shows_that_the_model_cannot_read_it(
    codex, start_worker, live_server, settings, store, answered, folder, tmp_path
):
    # Given onelane serving the agent model (a context of 8,192 tokens), and Codex CLI with its own instructions
    # and tools
    start_worker(served=settings)
    home = tmp_path / "codex"
    home.mkdir()
    config = CODEX_CONFIG.replace("model_instructions_file = {instructions}\n", "")
    config = config.replace("include_permissions_instructions = false\ninclude_environment_context = false\n", "")
    quoted = {"model": json.dumps(settings.model_name), "base_url": json.dumps(f"{live_server}/v1")}
    (home / "config.toml").write_text(config.format(**quoted))
    command = [codex, "exec", "--strict-config", "--ephemeral", "--skip-git-repo-check", "--json", TASK]
    # When it runs headless
    done = run(command, folder, CODEX_HOME=str(home), ONELANE_API_KEY=KEY)
    # Then onelane refused its prompt at once (OpenAI's code, context_length_exceeded), ran nothing, and Codex says
    # why, in its own words for that code
    assert answered == [("/v1/responses", 400)], answered
    assert store.list("agent") == []
    failed = [e for e in lines(done.stdout) if e["type"] == "turn.failed"]
    assert done.returncode != 0 and len(failed) == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert "ran out of room in the model's context window" in failed[0]["error"]["message"], failed
