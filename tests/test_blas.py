"""The worker's BLAS: OpenBLAS preloaded, and ahead of it worker/blas/shim.c, which keeps a fork from stopping
OpenBLAS's threads under a product, and multiplies every product (a decode step, a step verifying a few tokens of each
sequence, a prompt's chunk) with a kernel of its own that reads the weights once for up to 64 rows, shares the work
between both cores as it goes, and sums each element the same way whatever the rows. Each story runs MLX in a process
started with the worker's environment, as the worker runs, and checks every product against numpy in float64."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import with_shim
from worker.blas import SHIM_PREFIX, openblas_path, shim_library, worker_env

PRODUCTS = r"""
import ctypes, json, os, sys
from worker.blas import SHIM_PREFIX, preload_openblas
preload_openblas()  # as the worker starts: it is preloaded already, and the shim is told ONELANE_GEMV
import mlx.core as mx
import numpy as np

shim = [p for p in os.environ["LD_PRELOAD"].split() if SHIM_PREFIX in p]
rows_sent = (lambda: ctypes.c_long.in_dll(ctypes.CDLL(shim[0]), "onelane_gemv_rows").value) if shim else (lambda: 0)
rng = np.random.default_rng(7)
report = []
for m in (1, 2, 3, 4, 5, 8, 64, 65, 200):  # (65 and 200: blocks of 64 rows, and the rest)
    for a_t in (False, True):
        for b_t in (False, True):
            a = rng.standard_normal((m, 96)).astype(np.float32)
            b = rng.standard_normal((96, 80)).astype(np.float32)
            # op(A) op(B) as MLX's CPU backend asks cblas_sgemm for it: each operand stored as it is or transposed
            x = mx.array(a.T.copy()).T if a_t else mx.array(a)
            w = mx.array(b.T.copy()).T if b_t else mx.array(b)
            before = rows_sent()
            got = np.array(x @ w)
            want = a.astype(np.float64) @ b.astype(np.float64)
            report.append([m, a_t, b_t, float(np.abs(got - want).max()), rows_sent() - before])
print(json.dumps(report))
"""


def products(env: dict[str, str]) -> list[list[object]]:
    done = subprocess.run([sys.executable, "-c", PRODUCTS], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    if openblas_path() is None:
        assert not (sys.platform.startswith("linux") and os.environ.get("CI")), "./dev.sh installs OpenBLAS on Linux"
        pytest.skip("no OpenBLAS on this machine")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ONELANE_") and k != "LD_PRELOAD"}
    return {**environ, "ONELANE_VAR_DIR": str(with_shim(tmp_path))}  # (built once a test process: see the last story)


FORKS = r"""
import ctypes, os, sys, threading
import mlx.core as mx
from worker.blas import SHIM_PREFIX

shim = ctypes.CDLL([p for p in os.environ["LD_PRELOAD"].split() if SHIM_PREFIX in p][0])
rows = mx.random.normal((1, 576)), mx.random.normal((32, 576))
weights = mx.random.normal((576, 1536))
mx.eval(*rows, weights)
products, started, stop = [0], threading.Event(), threading.Event()


def multiply():  # one row and 32 rows: sgemv and sgemm, both on OpenBLAS's threads
    stream = mx.new_stream(mx.cpu)
    while not stop.is_set():
        for x in rows:
            mx.eval(mx.matmul(x, weights, stream=stream))
            products[0] += 1
        started.set()


thread = threading.Thread(target=multiply)
thread.start()
started.wait()
for _ in range(200):
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
before = products[0]
while products[0] < before + 10:  # still multiplying after the forks (without the shim it waits for ever)
    pass
stop.set()
thread.join()
print(ctypes.c_long.in_dll(shim, "onelane_forks_held").value)
"""


@pytest.mark.parametrize("gemv", ["true", "false"])
def test_a_fork_while_openblas_multiplies_waits_for_the_product_and_neither_hangs(clean_env, gemv):
    env = worker_env({**clean_env, "ONELANE_GEMV": gemv})
    done = subprocess.run([sys.executable, "-c", FORKS], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 200  # every fork went through the shim's handler


@pytest.mark.parametrize("kernel", ["", "avx2", "c"])  # the widest the CPU has, and the narrower ones
def test_every_product_goes_to_the_shims_kernel_and_is_right(clean_env, tmp_path, kernel):
    env = worker_env({**clean_env, "ONELANE_SHIM_KERNEL": kernel})  # on by default
    shim = shim_library(tmp_path)
    assert shim is not None and env["LD_PRELOAD"].split() == [shim, openblas_path()]  # ./dev.sh installs a compiler
    for m, a_t, b_t, error, rows in products(env):
        assert error < 1e-4, (m, a_t, b_t, error)  # float32 sums of 96 terms of order 1
        assert rows == m, (m, a_t, b_t, rows)  # a prompt's chunk too: OpenBLAS's sgemm stalls beside busy processes


def test_onelane_gemv_off_leaves_every_product_to_sgemm_with_the_same_results(clean_env, tmp_path):
    env = worker_env({**clean_env, "ONELANE_GEMV": "false"})
    assert env["LD_PRELOAD"].split() == [shim_library(tmp_path), openblas_path()]  # the shim still guards forks
    assert all(error < 1e-4 and rows == 0 for _, _, _, error, rows in products(env))


ROWS = r"""
import ctypes, json, os, sys
from worker.blas import SHIM_PREFIX, preload_openblas
preload_openblas()
import mlx.core as mx
import numpy as np

rng = np.random.default_rng(11)
bits = {}
# a Linear (x W^T: B transposed) with k a multiple of 16 and not, and attention's scores V (B not transposed)
for name, (k, n, b_t) in {"linear": (576, 1536, True), "odd": (303, 200, True), "scores_v": (303, 64, False)}.items():
    a = mx.array(rng.standard_normal((7, k)).astype(np.float32))
    b = mx.array(rng.standard_normal((n, k) if b_t else (k, n)).astype(np.float32))
    product = (lambda x: x @ b.T) if b_t else (lambda x: x @ b)
    seven = np.array(product(a))
    alone = [np.array(product(a[i : i + 1]))[0] for i in range(7)]
    assert all(np.array_equal(seven[i], alone[i]) for i in range(7)), name  # bit for bit
    chunk = np.array(product(mx.concatenate([a] * 20)))  # 140 rows: in blocks of 64, the same bits
    assert all(np.array_equal(chunk[i], alone[i % 7]) for i in range(140)), name
    bits[name] = seven.tobytes().hex()
shim = ctypes.CDLL([p for p in os.environ["LD_PRELOAD"].split() if SHIM_PREFIX in p][0])
child = os.fork()
if child == 0:  # no helper thread in the child (nor MLX's threads): its products start a helper of their own
    a = rng.standard_normal((7, 576)).astype(np.float32)
    w = rng.standard_normal((1536, 576)).astype(np.float32)
    c = np.zeros((7, 1536), np.float32)
    f, p, i = ctypes.c_float, ctypes.c_void_p, ctypes.c_int
    shim.cblas_sgemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
    shim.cblas_sgemm(101, 111, 112, 7, 1536, 576, 1.0, a.ctypes.data, 576, w.ctypes.data, 576, 0.0, c.ctypes.data, 1536)
    os._exit(0 if np.abs(c - a.astype(np.float64) @ w.astype(np.float64).T).max() < 1e-3 else 1)
assert os.waitpid(child, 0)[1] == 0
print(json.dumps(bits))
"""


def rows_bits(env: dict[str, str]) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-c", ROWS], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_a_row_multiplied_alone_or_beside_others_or_in_a_prompts_chunk_gives_the_same_bits(clean_env):
    widest = rows_bits(worker_env(clean_env))
    avx2 = rows_bits(worker_env({**clean_env, "ONELANE_SHIM_KERNEL": "avx2"}))
    assert avx2 == widest  # AVX-512 and AVX2 sum the same lanes in the same order (the C kernel: other bits)
    rows_bits(worker_env({**clean_env, "ONELANE_SHIM_KERNEL": "c"}))


THREADS = r"""
import ctypes, hashlib, json
from worker.blas import loaded_shim, preload_openblas
preload_openblas()  # as the worker starts: the shim told ONELANE_GEMV_THREADS
import mlx.core as mx
import numpy as np

x, w = mx.random.normal((4, 1024), key=mx.random.key(3)), mx.random.normal((2048, 1024), key=mx.random.key(4))
for _ in range(20):  # a decode step's product for four sequences, twenty times
    y = x @ w.T
    mx.eval(y)
shared = ctypes.c_long.in_dll(loaded_shim(), "onelane_products_shared").value
print(json.dumps([shared, hashlib.sha256(np.array(y).tobytes()).hexdigest()]))
"""


def test_one_gemv_thread_multiplies_each_product_on_the_workers_thread_alone_with_the_same_bits(clean_env):
    def run(threads: str) -> tuple[int, str]:
        env = worker_env({**clean_env, "ONELANE_GEMV_THREADS": threads})
        done = subprocess.run([sys.executable, "-c", THREADS], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        shared, bits = json.loads(done.stdout)
        return shared, bits

    (two, bits_two), (one, bits_one) = run("2"), run("1")
    assert two >= 20 and one == 0  # by default each step's product is shared with the helper; with 1, never
    assert bits_one == bits_two


def test_the_shim_is_built_once_per_version_of_its_source(clean_env, tmp_path):
    var = tmp_path / "var"  # (not the other stories' folder, which holds the test process's build)
    (var / "lib").mkdir(parents=True)
    (var / "lib" / f"{SHIM_PREFIX}0123456789ab.so").write_bytes(b"an earlier version's")
    first = shim_library(var)
    assert first is not None and Path(first).parent == var.resolve() / "lib"
    built = Path(first).stat().st_mtime_ns
    assert shim_library(var) == first and Path(first).stat().st_mtime_ns == built
    assert [p.name for p in (var / "lib").iterdir()] == [Path(first).name]  # no earlier or half-built one
