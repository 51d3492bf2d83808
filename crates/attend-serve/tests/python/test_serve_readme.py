"""The README's `attend serve` examples run as written against a server, the
address 127.0.0.1:8080 replaced by the test server's (tests listen on port 0)."""

from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pytest

from conftest import REPO

st = pytest.importorskip("sentence_transformers")


def section() -> str:
    readme = (REPO / "README.md").read_text()
    start = readme.index("### As a service: `attend serve`")
    return readme[start : readme.index("\n## ", start)]


def test_readme_curl_examples(shared):
    block = re.search(r"```sh\n(.*?)```", section(), re.S).group(1)
    commands = block.replace("\\\n", " ").splitlines()
    assert commands[0].startswith("attend serve")
    curls = [c.replace("127.0.0.1:8080", shared.address) for c in commands[1:]]
    assert len(curls) == 2
    openai_shape = json.loads(subprocess.run(curls[0], shell=True, capture_output=True, text=True, check=True).stdout)
    assert [len(d["embedding"]) for d in openai_shape["data"]] == [384, 384]
    tei_shape = json.loads(subprocess.run(curls[1], shell=True, capture_output=True, text=True, check=True).stdout)
    assert np.array(tei_shape).shape == (1, 384)


def test_readme_openai_example(shared, model_dir):
    block = re.search(r"```python\n(.*?)```", section(), re.S).group(1)
    names: dict = {}
    exec(compile(block.replace("127.0.0.1:8080", shared.address), "README.md (attend serve)", "exec"), names)
    want = st.SentenceTransformer(str(model_dir), device="cpu").encode(["A cat sat on the mat.", "Dogs bark."])
    assert np.abs(np.array(names["vectors"]) - want).max() < 1e-5
