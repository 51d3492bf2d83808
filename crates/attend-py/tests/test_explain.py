"""attend.explain against PyTorch's golden values of the five notebooks, against the
command line's own walkthrough, and on a real model's head."""

from __future__ import annotations

import html
import json
import math
import re
import subprocess

import numpy as np
import pytest

import attend
from conftest import REPO

GOLDEN = json.loads((REPO / "crates" / "attend-cli" / "tests" / "data" / "seeds.json").read_text())
CASES = GOLDEN["cases"]
ATTEND = REPO / "target" / "release" / "attend"

# The command line's flags whose values are numbers or JSON; the rest are strings
# or switches.
INTS = {"--vocab-size", "--embed-dim", "--padding-idx", "--seed", "--reseed", "--skip-draws",
        "--d-out", "--d-k", "--d-v", "--heads"}
JSONS = {"--input", "--wq", "--wk", "--wv"}
SWITCHES = {"--bias", "--out-proj", "--causal", "--mask-padding"}


def kwargs(args):
    """``attend explain`` flags as ``attend.explain`` keyword arguments."""
    kw, i = {}, 0
    while i < len(args):
        flag = args[i]
        name = flag[2:].replace("-", "_")
        if flag in SWITCHES:
            kw[name] = True
            i += 1
            continue
        value = args[i + 1]
        if flag in INTS:
            value = int(value)
        elif flag in JSONS:
            value = json.loads(value)
        elif flag == "--scale":
            value = float(value)
        kw[name] = value
        i += 2
    return kw


def golden_array(entry):
    data = [-math.inf if x is None else x for x in entry["data"]]
    return np.array(data, dtype=np.float64).reshape(entry["shape"])


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_golden_values_of_the_notebooks(case):
    ex = attend.explain(**kwargs(case["args"]))
    assert case["expect"], "a golden case with nothing to compare"
    for key, entry in case["expect"].items():
        got = getattr(ex, key).astype(np.float64)
        want = golden_array(entry)
        assert got.shape == want.shape, f"{key}: shape {got.shape} != {want.shape}"
        finite = np.isfinite(want)
        assert np.array_equal(np.isfinite(got), finite), f"{key}: masked entries differ"
        # The tolerance of the command line's golden test (crates/attend-cli/tests/golden_seeds.rs):
        # float32 values printed with 9 significant digits, a few ulps of float32 apart.
        diff = np.abs(got[finite] - want[finite])
        assert np.all(diff <= 1e-5 + 1e-5 * np.abs(want[finite])), f"{key}: max diff {diff.max():.3e}"


@pytest.mark.parametrize("case", CASES[:1] + CASES[-1:], ids=[CASES[0]["id"], CASES[-1]["id"]])
def test_str_is_the_command_lines_walkthrough(case):
    if not ATTEND.is_file():
        pytest.fail(f"{ATTEND} is missing: build it with cargo build --release -p attend-cli")
    cli = subprocess.run([str(ATTEND), "explain", *case["args"]], capture_output=True, text=True, check=True,
                         env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin"})
    assert str(attend.explain(**kwargs(case["args"]))) == cli.stdout


def test_jupyter_representation_has_the_heatmaps_and_the_view():
    ex = attend.explain(sentence="Life is short, eat dessert first", embed_dim=16, seed=123, reseed=123,
                        init="uniform-out-in", heads=3, d_k=72, d_v=84, skip_draws=1216)
    page = ex._repr_html_()
    assert page.count("<svg") == 1 and "<iframe srcdoc=" in page
    assert ex.tokens == ["Life", "is", "short", "eat", "dessert", "first"]
    assert ex.weights.shape == (1, 3, 6, 6)
    assert np.allclose(ex.weights.sum(-1), 1.0, atol=1e-6)
    assert "weights" in dir(ex)


def test_a_real_models_head(model_dir):
    text = "The animal didn't cross the street because it was too tired."
    ex = attend.explain(model=model_dir, text=text, layer=2, head=3)
    assert ex.tokens[0] == "[CLS]" and ex.tokens[-1] == "[SEP]"
    t = len(ex.tokens)
    assert ex.weights.shape == (t, t) and ex.q.shape == (t, 32)
    scaled = ex.q.astype(np.float64) @ ex.k.T.astype(np.float64) / math.sqrt(32)
    w = np.exp(scaled - scaled.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    assert np.abs(w - ex.weights).max() < 1e-5
    assert str(ex).startswith(f"{model_dir.name} — {text}, layer 2, head 3")


BAD = [
    (dict(), ValueError, "no input"),
    (dict(input=[[1, 2], [3]]), ValueError, "input"),
    (dict(input=[[1.0, 2.0]], init="xavier"), ValueError, "init must be one of linear"),
    (dict(tokens="1,2;3", vocab_size=5, embed_dim=4), ValueError, "tokens"),
    (dict(tokens=[[1, 9]], vocab_size=5, embed_dim=4), ValueError, "out of range"),
    (dict(sentence="a b", embed_dim=0), ValueError, "embed_dim"),
    (dict(sentence="a b", embed_dim=-1), ValueError, "embed_dim must be 0 or more, got -1"),
    (dict(sentence="a b", embed_dim=2.5), TypeError, "embed_dim must be an int, got float"),
    (dict(input=[[1.0, 2.0]], window=(-1, 1)), ValueError, "window must be 0 or more, got -1"),
    (dict(model="/nonexistent", text="hi", layer=-1, head=0), ValueError, "layer must be 0 or more, got -1"),
    (dict(input=[[1.0, 2.0]], wq=[[1.0]]), ValueError, "wq, wk and wv go together"),
    (dict(input=[[1.0, 2.0]], colour=True), TypeError, "colour"),
    (dict(input=[[1.0, 2.0]], layer=1), ValueError, "only apply with model="),
    (dict(model="/nonexistent", text="hi", layer=0, head=0, causal=True), ValueError, "causal"),
    (dict(model="/nonexistent", text="hi", layer=0, head=0), OSError, "/nonexistent"),
]


@pytest.mark.parametrize("kw,exc,text", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_arguments(kw, exc, text):
    with pytest.raises(exc) as info:
        attend.explain(**kw)
    assert text in str(info.value) and "\n" not in str(info.value)


def test_jupyter_shows_the_walkthrough_page_with_the_steps_numbers():
    ex = attend.explain(tokens="1,2,0,0;1,2,3,4", vocab_size=5, embed_dim=4, padding_idx=0, seed=2,
                        skip_draws=48, qkv="fused-interleaved", heads=2, d_out=4, mask_padding=True)
    page = ex.page()
    assert "http://" not in page and "https://" not in page
    found = re.search(r'<script id="attend-data" type="application/json">(.*?)</script>', page, re.S)
    steps = {s["key"]: s for s in json.loads(found.group(1))["steps"]}
    assert list(steps) == [key for key, _, _ in ex.steps]
    for key, step in steps.items():
        values = np.array([np.nan if v is None else v for v in step["data"]], dtype=np.float32)
        expected = ex.arrays[key].ravel()
        # The same f32 values; masked scores (-inf) are null in the page as in the JSON.
        assert np.array_equal(values, np.where(np.isfinite(expected), expected, np.nan), equal_nan=True), key
    assert html.escape(page, quote=True) in ex._repr_html_()


def test_window_masks_keys_outside_it_as_the_command_line_does():
    ex = attend.explain(input=[[1, 0], [0, 1], [1, 1], [2, 1]], seed=1, window=(1, 0))
    i, j = np.indices((4, 4))
    # Query i sees keys i - 1 and i.
    assert np.array_equal(np.isinf(ex.scaled[0, 0]), (j > i) | (j < i - 1))
    cli = subprocess.run([str(ATTEND), "explain", "--input", "[[1,0],[0,1],[1,1],[2,1]]", "--seed", "1",
                          "--window", "1,0", "--format", "json"], capture_output=True, text=True, check=True)
    assert np.array_equal(np.array(json.loads(cli.stdout)["weights"], dtype=np.float32), ex.weights)
