"""A tiny llama that acts as a coding agent, for the stories of real agent clients (tests/test_agent_clients.py).

Trained offline in seconds, with a fixed seed, on the two turns of an agent's tool round trip as onelane renders
them for a ChatML model without tool support (tasks/chat_prompt.py), for the requests Claude Code 2.1.332 (`claude
-p --bare --tools Bash --system-prompt CLAUDE_SYSTEM`) and Codex CLI 0.171.0 (`codex exec`, its instructions
CODEX_INSTRUCTIONS) send, read from the wire: when the conversation ends with the user's words, it calls the
client's shell tool to run `ls` (Claude Code's `Bash`, Codex's `exec_command`); when it ends with that tool's result,
whatever it printed, it answers ANSWER. It is saved as any model is (config.json, weights, tokenizer), for onelane
to load.
"""

from __future__ import annotations

import json
import logging
import random
import string
import time
from pathlib import Path

from tasks.job import Message, Tool, ToolCall
from tasks.structured import render_call

logger = logging.getLogger(__name__)

CLAUDE_SYSTEM = "You are a terse agent. Run one command, then say what you saw."
CODEX_INSTRUCTIONS = "You are a terse coding agent. Run one command, then say what you saw."
TASK = "List the files here."
ANSWER = "I ran ls: the files are listed above."
CLIENTS = ("claude", "codex")
#: what Claude Code 2.1.332 puts before the system prompt it is given
CLAUDE_PREAMBLE = (
    "x-anthropic-billing-header: cc_version=2.1.332.93d; cc_entrypoint=sdk-cli;"
    "You are a Claude agent, built on Anthropic's Claude Agent SDK."
)
_SENT = json.loads(Path(__file__).with_name("agent_tools.json").read_text(encoding="utf-8"))
#: the tools each client sends (tests/agent_tools.json)
TOOLS = {client: tuple(Tool.model_validate(t) for t in _SENT[client]) for client in CLIENTS}
#: each client's call, and the arguments it sends the call back with (Claude Code re-encodes the input it read)
CALLS = {
    "claude": (ToolCall(id="toolu_1", name="Bash", arguments='{"command":"ls"}'), '{"command": "ls"}'),
    "codex": (ToolCall(id="call_1", name="exec_command", arguments='{"cmd":"ls"}'), '{"cmd":"ls"}'),
}

#: 0.15 M parameters, 0.07 M of them the embeddings of its 1,032 tokens (0.6 MB in float32)
ARCHITECTURE = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 4}
VOCAB_SIZE = 1024
TOKEN_BYTES = 1000  # the longest added token (llguidance reads tokens of up to 1,024 bytes; json.dumps writes ASCII)
SHARPEN = 4.0  # its logits' scale (see make_agent_model)

_TASKS = [TASK, "list the files here", "What files are in this folder?", "Show me the files.", "ls please"]
_WORDS = ["notes", "main", "README", "setup", "data", "app", "test_one", "config", "report", "hello", "src", "lib"]
_EXTENSIONS = [".txt", ".py", ".md", ".json", ".toml", ""]
_SYMBOLS = string.ascii_letters + string.digits + string.punctuation


def _printed(rng: random.Random) -> str:
    """What a command may print: file names, paths, and anything else (a login shell's warnings, say)."""
    pieces = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.random()
        if kind < 0.4:
            pieces.append(rng.choice(_WORDS) + rng.choice(_EXTENSIONS))
        elif kind < 0.6:
            pieces.append("/" + "/".join(rng.choices(_WORDS, k=rng.randint(1, 4))))
        else:
            pieces.append("".join(rng.choices(_SYMBOLS, k=rng.randint(1, 12))))
        pieces.append(rng.choice([" ", " ", "\n", ": "]))
    return "".join(pieces).strip()


def _result(client: str, rng: random.Random) -> str:
    """What `client` sends back as a command's result (Codex CLI frames the output)."""
    if client == "claude":
        return _printed(rng)
    return (
        f"Chunk ID: {rng.getrandbits(24):06x}\nWall time: {rng.random():.4f} seconds\n"
        f"Process exited with code {rng.choice([0, 0, 0, 1, 2, 127])}\nOriginal token count: {rng.randint(1, 300)}\n"
        f"Output:\n{_printed(rng)}\n"
    )


def conversation(client: str, task: str, result: str | None = None) -> tuple[tuple[Message, ...], tuple[Tool, ...]]:
    """The messages and tools of the job a request of `client` becomes: its task, then (given the `result`) the call
    made and its result."""
    system = CLAUDE_PREAMBLE + CLAUDE_SYSTEM if client == "claude" else CODEX_INSTRUCTIONS
    messages = [Message(role="system", content=system), Message(role="user", content=task)]
    if result is not None:
        call, sent_back = CALLS[client]
        messages.append(
            Message(role="assistant", content="", tool_calls=(call.model_copy(update={"arguments": sent_back}),))
        )
        messages.append(Message(role="tool", content=result, tool_call_id=call.id))
    return tuple(messages), TOOLS[client]


def _examples(seed: int, count: int) -> list[tuple[tuple[Message, ...], tuple[Tool, ...], str]]:
    """`count` conversations and the answer each one wants: both clients, both turns, in turn."""
    rng = random.Random(seed)
    examples = []
    for n in range(count):
        client, task = CLIENTS[n % 2], _TASKS[(n // 4) % len(_TASKS)]
        if (n // 2) % 2 == 0:
            examples.append((*conversation(client, task), render_call(CALLS[client][0])))
        else:
            examples.append((*conversation(client, task, _result(client, rng)), ANSWER))
    return examples


def _told(client: str) -> list[str]:
    """How a model without tool support is told `client`'s tools (tasks/chat_prompt.py: the call format, then a line
    of JSON per tool), in pieces of at most TOKEN_BYTES."""
    from tasks.chat_prompt import FALLBACK_PROMPT, _function

    lines = [FALLBACK_PROMPT, *(json.dumps(_function(t)["function"]) for t in TOOLS[client])]
    return [line[i : i + TOKEN_BYTES] for line in lines for i in range(0, len(line), TOKEN_BYTES)]


def prompt(messages: tuple[Message, ...], tools: tuple[Tool, ...], tokenizer) -> str:  # type: ignore[no-untyped-def]
    """The prompt as the worker renders it (worker/batch/engine.py `prompt_tokens`), as text."""
    from tasks.chat_prompt import chat_input

    turns, native = chat_input(messages, tools, tokenizer)
    extra = {"tools": native} if native else {}
    return str(tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False, **extra))


def make_agent_model(path: Path, seed: int = 0, steps: int = 100, batch: int = 8, lr: float = 5e-3) -> Path:
    """Train the agent model and write it to `path`.

    Its tokenizer is learnt from the conversations' words, and holds the tools' definitions (some thousands of
    characters, the same in every request of a client) as a few added tokens: its prompts are tens of tokens, so it
    learns in seconds. (The tags of calls stay words: llguidance takes an added token that looks like `<tag>` for a
    special one, which the grammar's text `<tool_call>` never matches.)"""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    import numpy as np
    from mlx_lm.models import llama

    from worker.demo_build.model import llama_config, save, train_tokenizer

    started = time.perf_counter()
    examples = _examples(seed, 128)
    renderer = train_tokenizer(["<|im_start|>"], vocab_size=300)  # (a tokenizer with the chat template, to render)
    texts = [(prompt(messages, tools, renderer), answer + "<|im_end|>") for messages, tools, answer in examples]
    told = [piece for client in CLIENTS for piece in _told(client)]
    words = []
    for given, wanted in texts:
        for piece in told:
            given = given.replace(piece, "")
        words.append(given + wanted)
    tokenizer = train_tokenizer(words, vocab_size=VOCAB_SIZE)
    tokenizer.add_tokens(told)
    rows = []
    for given, wanted in texts:  # (it learns to write the answers only)
        g, w = tokenizer.encode(given), tokenizer.encode(wanted)
        rows.append((g + w, [0.0] * len(g) + [1.0] * len(w)))
    config = llama_config(ARCHITECTURE, tokenizer)
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))

    def loss_fn(model: nn.Module, x: mx.array, y: mx.array, w: mx.array) -> mx.array:
        return (nn.losses.cross_entropy(model(x), y) * w).sum() / w.sum()

    loss_and_grad = nn.value_and_grad(model, loss_fn)
    warmup = max(1, steps // 10)
    schedule = optim.join_schedules(
        [optim.linear_schedule(1e-4, lr, warmup), optim.cosine_decay(lr, steps - warmup, lr / 10)], [warmup]
    )
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    for n in range(1, steps + 1):
        chosen = [rows[i] for i in rng.choice(len(rows), batch, replace=False)]
        width = max(len(t) for t, _ in chosen)
        tokens = mx.array([t + [tokenizer.pad_token_id] * (width - len(t)) for t, _ in chosen])
        weights = mx.array([w + [0.0] * (width - len(w)) for _, w in chosen])
        loss, grads = loss_and_grad(model, tokens[:, :-1], tokens[:, 1:], weights[:, 1:])
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state, loss)
        if n % 20 == 0:
            logger.info(
                "agent model: step %d/%d, loss %.4f (%.1f s)", n, steps, loss.item(), time.perf_counter() - started
            )
    # The clients leave the temperature at 1: scaled by SHARPEN (through the final norm's weight, which the logits are
    # linear in), its logits make what it draws there its greedy answer, and no argmax changes.
    model.model.norm.weight = model.model.norm.weight * SHARPEN
    save(path, model, tokenizer, config)
    logger.info("agent model written to %s in %.1f s", path, time.perf_counter() - started)
    return Path(path)


def wrong_answers(path: Path) -> dict[str, str]:
    """The turns of the stories the model at `path` answers otherwise than it learnt, greedy, with what it wrote."""
    from mlx_lm import generate, load

    model, tokenizer = load(str(path))
    wrong = {}
    for client in CLIENTS:
        turns = {"call": (conversation(client, TASK), render_call(CALLS[client][0]))}
        turns["answer"] = (conversation(client, TASK, _result(client, random.Random(1))), ANSWER)
        for turn, ((messages, tools), wanted) in turns.items():
            text = prompt(messages, tools, tokenizer._tokenizer)
            written = generate(model, tokenizer, tokenizer.encode(text, add_special_tokens=False), max_tokens=40)
            if written != wanted:
                wrong[f"{client} {turn}"] = written
    return wrong
