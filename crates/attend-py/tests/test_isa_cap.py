"""ATTEND_MAX_ISA from Python: the package runs the path it names and says so, and a
name that is no instruction set fails the import with one message naming the
variable. Each case in a fresh interpreter, since the cap is read at import."""

from __future__ import annotations

import os
import subprocess
import sys


def run_python(code, cap):
    env = dict(os.environ, ATTEND_MAX_ISA=cap)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_the_capped_path_runs_and_is_reported():
    code = (
        "import numpy as np, attend\n"
        "q = np.ones((1, 1, 3, 4), np.float32)\n"
        "out = attend.scaled_dot_product_attention(q, q, q)\n"
        "print(attend.isa(), float(out.sum()))\n"
    )
    run = run_python(code, "portable")
    assert run.returncode == 0, run.stderr
    isa, total = run.stdout.split()
    assert isa == "portable"
    # Equal keys give equal weights: the output is the mean of the values, all ones.
    assert float(total) == 12.0


def test_an_unknown_cap_fails_the_import_naming_the_variable():
    run = run_python("import attend", "avx9000")
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert "ATTEND_MAX_ISA" in last and "avx9000" in last, run.stderr
