"""The README's Python example runs as written, given the names it leaves to the
reader (q, k, v, mask, a model directory, some sentences)."""

from __future__ import annotations

import re

import torch

from conftest import REPO


def test_readme_python_example_runs(model_dir):
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### From Python") :]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    from transformers import AutoModel

    q, k, v = (torch.randn(2, 4, 7, 16) for _ in range(3))
    names = dict(
        q=q, k=k, v=v, mask=torch.ones(7, 7, dtype=torch.bool), path=str(model_dir), model_dir=model_dir,
        sentences=["A cat sat on the mat.", "Dogs bark."], AutoModel=AutoModel,
    )
    exec(compile(block, "README.md (From Python)", "exec"), names)
    assert names["out"].shape == (2, 4, 7, 16)
    assert names["vectors"].shape == (2, 384)
    assert names["model"].config._attn_implementation == "attend"
    assert names["ex"].weights.shape == (1, 1, 6, 6)
