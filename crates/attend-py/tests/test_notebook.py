"""examples/self_attention.ipynb, executed by a real Jupyter kernel (nbclient): it runs
without errors and prints notebook 004's numbers as PyTorch computed them (the golden
values of crates/attend-cli/tests/data/seeds.json)."""

from __future__ import annotations

import json

import nbclient
import nbformat
import numpy as np

from conftest import REPO

NOTEBOOK = REPO / "examples" / "self_attention.ipynb"


def golden(key):
    cases = json.loads((REPO / "crates" / "attend-cli" / "tests" / "data" / "seeds.json").read_text())["cases"]
    case = next(c for c in cases if c["id"] == "seed004-single-head-softmax-keys")
    entry = case["expect"][key]
    return np.array(entry["data"], dtype=np.float64).reshape(entry["shape"])


def printed_arrays(text):
    """The NumPy arrays a cell printed, one per bracketed block."""
    blocks, depth, current = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        if depth:
            current += ch
        if ch == "]":
            depth -= 1
            if depth == 0:
                blocks.append(np.array(current.strip("[]").split(), dtype=np.float64))
                current = ""
    return blocks


def test_notebook_runs_and_prints_pytorchs_numbers():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    outputs = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.outputs:
            assert out.output_type != "error", f"{cell.source!r} raised {out.get('ename')}: {out.get('evalue')}"
        first_line = cell.source.splitlines()[0]
        outputs[first_line] = cell.outputs

    def stdout(first_line):
        return "".join(o.get("text", "") for o in outputs[first_line] if o.output_type == "stream")

    # Printed with 4 decimals: half a unit of the last place, plus float32's error.
    tol = 5e-5 + 1e-6
    omega = printed_arrays(stdout("omega_2 = ex.scores[0, 0, 1]"))[0]
    assert np.abs(omega - golden("scores")[0, 0, 1]).max() <= tol * max(1.0, np.abs(omega).max())
    weights = printed_arrays(stdout("attention_weights_2 = ex.weights[0, 0, 1]"))[0]
    assert np.abs(weights - golden("weights")[0, 0, 1]).max() <= tol
    context = printed_arrays(stdout("context_vector_2 = ex.context[0, 1]"))[-1]
    assert context.shape == (28,)
    assert np.abs(context - golden("context")[0, 1]).max() <= tol

    shown = [o for o in outputs["heads = attend.explain(sentence=\"Life is short, eat dessert first\", embed_dim=16, seed=123, reseed=123,"]
             if o.output_type == "execute_result"]
    assert len(shown) == 1 and "<svg" in shown[0]["data"]["text/html"] and "<iframe" in shown[0]["data"]["text/html"]
    fused_gap = float(stdout("fast = attend.scaled_dot_product_attention(ex.q, ex.k, ex.v)"))
    assert fused_gap < 1e-5
