"""attend.ray.Embedder on a local Ray cluster (two CPUs, two actors) over 10,000
texts: every row comes back with its own text's vector, equal to one process's
``SentenceEncoder.encode`` of the same texts.

The tolerance. Ray hands each actor its own batches, and ``encode`` sorts and pads
each batch by itself, so a text meets different padding than in the one-process
run. Padded keys are masked, so the two runs are two float32 evaluations of the
same exact vectors that differ in rounding alone. docs/design.md's rule lets each
evaluation err by twice a naive float32 implementation's error plus the float32
rounding floor; the naive error is measured here, as attend's distance D from
sentence-transformers' float32 PyTorch vectors on a sample of the same texts. So the
runs may differ by 2·D plus the floor, 4 ulps of the largest |entry|.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import attend  # noqa: E402
import attend.ray  # noqa: E402
from conftest import REPO  # noqa: E402

N_TEXTS = 10_000
WORDS = (
    "attention the cat sat on a mat while encoders embed every sentence quickly bank river "
    "rates raised its because tired street animal did not cross"
).split()


def corpus(n: int) -> list[str]:
    """``n`` distinct texts of 2 to 12 words from a fixed generator."""
    rng = np.random.default_rng(16)
    lengths = rng.integers(2, 13, size=n)
    return [f"{i} " + " ".join(rng.choice(WORDS, size=k)) for i, k in enumerate(lengths)]


@pytest.fixture(scope="module")
def local_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def naive_error(model_dir) -> float:
    """D: attend's max distance from sentence-transformers (float32) on 256 of the texts."""
    st = pytest.importorskip("sentence_transformers")
    texts = corpus(N_TEXTS)[:256]
    model = st.SentenceTransformer(str(model_dir), device="cpu")
    theirs = model.encode(texts, batch_size=32, convert_to_numpy=True)
    ours = attend.SentenceEncoder(model_dir).encode(texts, batch_size=32)
    return float(np.abs(ours - theirs).max())


def tolerance(naive_error: float, want: np.ndarray) -> float:
    """2·D plus 4 ulps of the largest |entry| (see the module's docstring)."""
    return 2 * naive_error + 4 * np.finfo(np.float32).eps * float(np.abs(want).max())


def test_ray_embeds_like_one_process(model_dir, local_cluster, naive_error):
    texts = corpus(N_TEXTS)
    ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)], override_num_blocks=20)
    ds = ds.map_batches(
        attend.ray.Embedder,
        fn_constructor_args=(str(model_dir),),
        compute=ray.data.ActorPoolStrategy(size=2),
        batch_size=250,
    )
    rows = ds.take_all()
    rows.sort(key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(N_TEXTS))
    assert all(r["text"] == t for r, t in zip(rows, texts))
    got = np.stack([r["embedding"] for r in rows])
    assert got.dtype == np.float32 and got.shape == (N_TEXTS, 384)

    want = attend.SentenceEncoder(model_dir).encode(texts, batch_size=32)
    tol = tolerance(naive_error, want)
    worst = float(np.abs(got - want).max())
    print(f"Ray vs one process: max abs diff {worst:.3g}, tolerance {tol:.3g} (D = {naive_error:.3g})")
    assert worst <= tol
    # Each row is nearest its own text's vector: a shuffle could not pass.
    sample = np.arange(0, N_TEXTS, 97)
    dist = np.abs(got[sample][:, None, :] - want[None, :, :]).max(axis=2)
    assert (dist.argmin(axis=1) == sample).all()


def test_readme_ray_example_runs(model_dir, local_cluster, naive_error, tmp_path):
    page = (REPO / "docs" / "python.md").read_text()
    section = page[page.index("## Out to a cluster: Ray Data") :]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    texts = corpus(40)
    (tmp_path / "corpus.txt").write_text("\n".join(texts) + "\n")
    # The workers resolve relative paths against the directory Ray started in, so
    # the example's file names become absolute ones here.
    for name in ('"corpus.txt"', '"embedded/"'):
        assert block.count(name) == 1, f"the docs/python.md example no longer names {name}"
        block = block.replace(name, repr(str(tmp_path / name.strip('"'))))
    exec(compile(block, "docs/python.md (Ray Data)", "exec"), dict(model_dir=str(model_dir)))
    rows = ray.data.read_parquet(str(tmp_path / "embedded")).take_all()
    by_text = {r["text"]: np.asarray(r["embedding"]) for r in rows}
    assert sorted(by_text) == sorted(texts)
    got = np.stack([by_text[t] for t in texts])
    want = attend.SentenceEncoder(model_dir).encode(texts)
    assert float(np.abs(got - want).max()) <= tolerance(naive_error, want)


@pytest.fixture
def default_threads():
    yield
    attend.set_num_threads(None)  # Embedder(num_threads=) set it for the whole process


def test_embedder_outside_ray_and_its_errors(model_dir, default_threads):
    emb = attend.ray.Embedder(model_dir, column="body", output_column="vec", num_threads=1)
    assert attend.get_num_threads() == 1
    out = emb({"body": np.array(["A cat.", "Dogs bark."], dtype=object), "id": np.array([3, 4])})
    assert out["vec"].shape == (2, 384) and list(out["id"]) == [3, 4]
    np.testing.assert_array_equal(out["vec"], emb.encoder.encode(["A cat.", "Dogs bark."]))
    pd = pytest.importorskip("pandas")
    frame = emb(pd.DataFrame({"body": ["A cat.", "Dogs bark."]}))
    np.testing.assert_array_equal(np.stack(frame["vec"]), out["vec"])
    with pytest.raises(KeyError, match="no column 'body'"):
        emb({"text": np.array(["x"])})
    with pytest.raises(ValueError, match="already has a column 'vec'"):
        emb({"body": np.array(["x"]), "vec": np.array([1])})
    with pytest.raises(TypeError, match="column 'body' row 1 holds int, not str"):
        emb({"body": np.array(["x", 5], dtype=object)})
