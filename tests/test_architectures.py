"""Every architecture of the installed mlx-lm whose tiny model builds on the CPU (tests/tiny_archs.py), served by
onelane's real worker: three prompts of different lengths at once, greedy, 12 tokens past EOS, and each answer equal
to mlx-lm's own greedy answer to that prompt alone (issue 48).

One worker serves them all from one catalog, one architecture at a time. An architecture onelane served wrong would be
marked xfail, strict, with what was seen (FAILING): the day it is fixed, its test fails until the mark goes.
`./dev.sh bench architectures` prints the whole table (cache types, batched or alone, equal or not).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.connection import connect
from tasks.embedded_redis import EmbeddedRedis
from tasks.settings import Settings
from tests.tiny_archs import Sweep, architectures, build_all

# A step that makes no token for this long ends its jobs (the supervisor's watch, played by the sweep), not the
# default 120 s; a first run of an architecture may spend seconds compiling its kernels (MLX's CPU build compiles
# with the system's C++ compiler, then keeps them under /tmp/mlx), so not less.
STALL_S = 20.0

#: what onelane does wrong with each today, as seen running this file (none: every architecture's answers are its own,
#: batched or alone as worker/batch/sharing.py finds them at load)
FAILING: dict[str, str] = {}

ARCHS = [
    pytest.param(arch, marks=pytest.mark.xfail(strict=True, reason=FAILING[arch])) if arch in FAILING else arch
    for arch in architectures()
]


@pytest.fixture(scope="module")
def sweep(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sweep]:
    """Every tiny model built once, and one in-process worker serving them all (a batch of up to 4)."""
    client = connect(redis_server.url)
    client.flushall()
    folders = build_all(tmp_path_factory.mktemp("architectures"), architectures())
    settings = Settings(
        redis_url=redis_server.url, var_dir=Path(tmp_path_factory.mktemp("var")), max_batch=4, lease_s=6
    )
    running = Sweep(settings, folders, STALL_S).start()
    yield running
    running.stop()
    client.flushall()
    client.close()
    assert running.fatal == [], "the in-process worker hit a fatal condition"


@pytest.mark.parametrize("arch", ARCHS)
def test_each_answer_in_a_batch_is_mlx_lms_answer_alone(arch: str, sweep: Sweep) -> None:
    # Given three prompts of different lengths sent together, When onelane serves them,
    row = sweep.run(arch)

    # Then each is answered, and its answer is the one mlx-lm gives that prompt alone
    assert row.equal, f"{arch} ({', '.join(row.caches)}; {row.mode}): {row.failure()}"


def test_the_answers_above_were_given_speculating(sweep: Sweep) -> None:
    # Given every architecture's answers above, equal to mlx-lm's alone, served with speculation on (the default)
    assert sweep.rows, "run with the architectures' tests"
    # Then most models' answers kept proposed tokens (their tiny answers repeat themselves): the equality above holds
    # with speculation at work, not beside it
    # (of the models whose caches can be cut a row at a time: a recurrent state or a rotating window cannot)
    cuttable = {arch for arch, row in sweep.rows.items() if set(row.caches) == {"KVCache"}}
    speculated = [arch for arch in cuttable if any(s.accepted for s in sweep.rows[arch].served)]
    assert len(speculated) >= len(cuttable) // 2, f"only {sorted(speculated)} of {sorted(cuttable)} kept proposals"
