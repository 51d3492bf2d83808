"""A process that forks after using attend works in the child.

fork copies only the thread that calls it: the worker threads of the thread pools
the parent built are not in the child, and a job handed to one of those pools would
wait for them forever. attend's pools belong to the process that built them, so a
child builds its own (``attend::threads::pool``).

Each scenario runs in a fresh interpreter, in its own session, with a time limit: a
hang then fails the test (and the whole process group, forked children included, is
killed) instead of hanging the suite. The limit is far above what a scenario needs
(a few seconds); it measures nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

LIMIT_S = 180


def run_scenario(tmp_path, source: str, *args: str) -> str:
    """Runs ``source`` as a script in a new session; its stdout, or a failure if it
    exits non-zero or is still running after ``LIMIT_S`` seconds."""
    script = tmp_path / "scenario.py"
    script.write_text(textwrap.dedent(source))
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the scenario hung (killed after {LIMIT_S} s)")
    assert proc.returncode == 0, f"the scenario failed ({proc.returncode}):\n{err}"
    return out


# The parent names a thread count, so that the child asks for a pool of the count
# the parent built (without it, a DataLoader worker, which PyTorch sets to one
# thread, would ask for a count the parent may never have used).
COMMON = """
import os
import numpy as np
import attend

attend.set_num_threads(2)
rng = np.random.default_rng(7)
# Large enough for the pool (over attend._attend.SMALL_WORK multiply-adds); SMALL is
# a call the calling thread runs alone.
SHAPES = {"pooled": (2, 3, 128, 64), "small": (1, 2, 8, 16)}
SHAPE = SHAPES[os.environ.get("ATTEND_TEST_CALL", "pooled")]
q, k, v = (rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3))
assert (SHAPE == SHAPES["small"]) == (2 * np.prod(SHAPE) * SHAPE[2] < attend._attend.SMALL_WORK)


def attention(_=None):
    return attend.scaled_dot_product_attention(q, k, v)
"""


@pytest.mark.parametrize("call", ["pooled", "small"])
def test_os_fork_child_runs_attention(tmp_path, monkeypatch, call):
    monkeypatch.setenv("ATTEND_TEST_CALL", call)
    out = run_scenario(
        tmp_path,
        COMMON
        + """
parent = attention()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read)
    child = attention()
    with os.fdopen(write, "wb") as pipe:
        pipe.write(child.tobytes())
    os._exit(0)
os.close(write)
with os.fdopen(read, "rb") as pipe:
    child = np.frombuffer(pipe.read(), dtype=np.float32).reshape(parent.shape)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
np.testing.assert_allclose(child, parent, rtol=1e-6, atol=1e-6)
print("forked child ok")
""",
    )
    assert "forked child ok" in out


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_multiprocessing_pool_runs_attention(tmp_path, method):
    out = run_scenario(
        tmp_path,
        COMMON
        + """
import multiprocessing
import sys

if __name__ == "__main__":
    parent = attention()
    with multiprocessing.get_context(sys.argv[1]).Pool(2) as pool:
        results = pool.map(attention, range(4))
    for r in results:
        np.testing.assert_allclose(r, parent, rtol=1e-6, atol=1e-6)
    print("pool ok")
""",
        method,
    )
    assert "pool ok" in out


def test_dataloader_workers_run_the_sdpa(tmp_path):
    out = run_scenario(
        tmp_path,
        COMMON
        + """
import torch
from torch.utils.data import DataLoader, Dataset

tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))


class Attended(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return attend.scaled_dot_product_attention(tq[:, i % 3], tk[:, i % 3], tv[:, i % 3])


if __name__ == "__main__":
    data = Attended()
    parent = [data[i] for i in range(len(data))]
    loader = DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context="fork")
    for got, want in zip(loader, parent):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    print("dataloader ok")
""",
    )
    assert "dataloader ok" in out


def test_dataloader_workers_run_a_sentence_encoder(tmp_path, model_dir):
    out = run_scenario(
        tmp_path,
        """
import sys
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
import attend

TEXTS = ["A cat sat on the mat.", "Dogs bark at night.", "The stock market fell.", "Rain is coming."]
attend.set_num_threads(2)


class Embedded(Dataset):
    def __init__(self, encoder):
        self.encoder = encoder

    def __len__(self):
        return len(TEXTS)

    def __getitem__(self, i):
        return torch.from_numpy(self.encoder.encode(TEXTS[i]))


if __name__ == "__main__":
    encoder = attend.SentenceEncoder(sys.argv[1])
    parent = np.stack([encoder.encode(t) for t in TEXTS])
    loader = DataLoader(Embedded(encoder), batch_size=None, num_workers=2, multiprocessing_context="fork")
    got = torch.stack(list(loader)).numpy()
    np.testing.assert_allclose(got, parent, rtol=1e-5, atol=1e-6)
    print("encoder ok")
""",
        str(model_dir),
    )
    assert "encoder ok" in out
