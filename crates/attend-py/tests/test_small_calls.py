"""A call too small to gain from a second thread runs on the calling thread alone.

Handing a tiny attention call to a pool's workers and being woken back costs more
than the call (scripts/bench/op-overhead), so under ``attend._attend.SMALL_WORK``
multiply-adds the extension runs it where it was called. Seen from outside: such a
call starts no worker threads, while a larger one starts its pool's. Each check runs
in a fresh interpreter, so that no earlier call has built a pool.

A worker names itself once it runs, which on a loaded machine can be after the call
that built its pool has returned (the other workers may have done all the work). So
the large call's count is polled until it reaches the pool's size, within a bound,
and the small call's count is taken after a pause long enough for any worker it had
started to have named itself.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc")

SCENARIO = """
import os
import time
import numpy as np
import attend
from attend import _attend

# A thread count no other part of the process asks for: its pool's workers are
# named attend-3-0, attend-3-1, attend-3-2.
attend.set_num_threads(3)


def workers():
    names = (open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
    return sum(name.startswith("attend-3-") for name in names)


def workers_within(seconds, until):
    deadline = time.monotonic() + seconds
    while not until(workers()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return workers()


def call(length, head=64):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 8, length, head)).astype(np.float32) for _ in range(3))
    madds = 8 * length * length * 2 * head
    out = attend.scaled_dot_product_attention(q, k, v)
    w = np.exp(q @ k.transpose(0, 1, 3, 2) / np.sqrt(head))
    np.testing.assert_allclose(out, (w / w.sum(-1, keepdims=True)) @ v, rtol=1e-4, atol=1e-5)
    return madds


small = call(16)
assert small < _attend.SMALL_WORK, small
print("after a small call:", workers_within(1.0, lambda n: n > 0))
large = call(128)
assert large >= _attend.SMALL_WORK, large
print("after a large call:", workers_within(30.0, lambda n: n >= 3))
"""


def test_a_small_call_starts_no_workers_and_a_large_one_does():
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(SCENARIO)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "after a small call: 0" in done.stdout, done.stdout
    assert "after a large call: 3" in done.stdout, done.stdout
