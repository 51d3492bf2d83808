#!/usr/bin/env python3
"""Driver of scripts/bench/encoders: sentence-transformers' ``encode`` against
``attend.SentenceEncoder.encode`` on any encoder family attend loads (all-MiniLM-L6-v2,
all-mpnet-base-v2, ...), on scripts/bench/py/bench_py_models.py's 32 sentences in one batch.

Both sides run on the same number of threads (torch.set_num_threads; attend follows
it). Each round times both sides back to back, in alternating order, each as the
median of several calls; the table shows the median over rounds and the ratio
sentence-transformers / attend (above 1: attend is faster). The embeddings must agree
first.

sentence-transformers' own ONNX and OpenVINO backends (``backend="onnx"``,
``"openvino"``) are timed too when they load. They need ``optimum[onnxruntime]`` /
``optimum[openvino]``, which on 2026-11-25 (optimum-intel 1.27) require transformers
4.x: installing them would replace the project's transformers 5.23, so the test
environment leaves them out and the script prints why each backend did not load.
scripts/bench/openvino times OpenVINO and ONNX Runtime directly instead.

  scripts/bench/encoders [--rounds N] [--reps N] [--threads N] MODEL_DIR...
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_py_models import SENTENCES, encoders  # noqa: E402
from model_rounds import OtherLoad, alternate, cpu_name  # noqa: E402
import record  # noqa: E402

import numpy as np  # noqa: E402
import sentence_transformers  # noqa: E402
import torch  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

import attend  # noqa: E402

# Unit vectors from float32 encoders: rounding moves their entries by 1e-7 to 1e-6
# (test_families.py measures 4e-7 on all-mpnet-base-v2 against float64); a masking,
# position or pooling mistake moves them by 1e-3 or more.
EMBEDDING_TOLERANCE = 1e-5

# sentence-transformers' other inference backends, timed when they load.
BACKENDS = ("onnx", "openvino")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dirs", nargs="+", help="checkpoint directories (scripts/fetch-model [mpnet])")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=3, help="calls per side per round")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", "2")))
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    attend.set_num_threads(args.threads)
    print(f"CPU: {cpu_name()}")
    print(
        f"threads: {args.threads}; torch {torch.__version__}, sentence-transformers "
        f"{sentence_transformers.__version__}, attend {attend.__version__} ({attend.isa()})"
    )
    print(f"{args.rounds} rounds x {args.reps} calls per side; load average before: {os.getloadavg()}")
    others = OtherLoad()
    rows = []
    for model_dir in args.model_dirs:
        st_encode, attend_encode = encoders(model_dir)
        diff = float(np.abs(st_encode().astype(np.float64) - attend_encode().astype(np.float64)).max())
        assert diff <= EMBEDDING_TOLERANCE, f"{model_dir}: embeddings disagree by {diff:.3g}"
        sides = {"sentence-transformers": st_encode, "attend": attend_encode}
        for backend in BACKENDS:
            try:
                other = SentenceTransformer(model_dir, device="cpu", backend=backend)
            except Exception as e:  # a missing optimum raises ImportError, others vary
                reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                print(f"  sentence-transformers backend={backend!r} did not load: {reason}")
                continue
            sides[f"sentence-transformers {backend}"] = (
                lambda other=other: other.encode(SENTENCES, batch_size=32, convert_to_numpy=True)
            )
        times = alternate(sides, args.rounds, args.reps)
        rows.append((os.path.basename(os.path.normpath(model_dir)), times, diff))
        print(f"  {rows[-1][0]}: " + "; ".join(
            f"{name} " + " ".join(f"{v:.1f}" for v in values) for name, values in times.items()))

    others.report()
    print("\n| model | sentence-transformers median (ms) | attend median (ms) | ratio | max abs diff |")
    print("|---|---:|---:|---:|---:|")
    for name, times, diff in rows:
        a = statistics.median(times["attend"])
        for side in (s for s in times if s != "attend"):
            b = statistics.median(times[side])
            label = name + side.removeprefix("sentence-transformers").replace(" ", ", ", 1)
            print(f"| {label} | {b:.1f} | {a:.1f} | {b / a:.2f}x | {diff:.2g} |")
    record.write(
        "encoders", "SentenceEncoder.encode on 32 sentences, one batch, against sentence-transformers' encode, f32",
        unit="ms", better="lower", threads=args.threads,
        peers={"sentence-transformers": sentence_transformers.__version__, "torch": torch.__version__},
        rows=[record.row(name, statistics.median(times["attend"]), side, statistics.median(times[side]))
              for name, times, _ in rows for side in times if side != "attend"],
        other_load=others.share(),
    )


if __name__ == "__main__":
    main()
