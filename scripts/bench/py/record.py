"""One JSON record per comparison a benchmark script prints: what ran, on which CPU
(its name, family and model, the flags that decide attend's path, its measured
peaks), at which commit and when, against which peers (their versions), and every
row with both sides' figures and the ratio. scripts/bench/report renders the
records into docs/speed.md and the charts in docs/img/; a record is written once
by the script that measured it and never edited.

Records go to bench/results/ in the repository, or to $ATTEND_BENCH_RESULTS.

From Python::

    import record
    record.write("vs-ort", "fused forward against ONNX Runtime's MultiHeadAttention",
                 unit="ms", better="lower", threads=2, peers={"onnxruntime": record.version("onnxruntime")},
                 rows=[record.row("B1 H8 N512 d64", 1.2, "onnxruntime", 1.5, share_of_peak=0.81)],
                 peaks={"f32_gflops": 482.0})

From a shell script, rows as tab-separated lines (workload, attend, peer, peer's
figure, and optionally attend's share of the peak as a fraction)::

    python3 scripts/bench/py/record.py --script vs-torch --title "..." --unit ms \
        --better lower --threads 2 --peer torch=2.15.0 --peak f32_gflops=482 < rows.tsv
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[3]
# The flags that decide which of attend's paths runs, and the peaks.
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16")
SCHEMA = 1


def cpu() -> dict:
    """This CPU: name, family and model, logical CPUs, and which FLAGS it has."""
    info: Dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "cpu family", "model", "flags") and key not in info:
                info[key] = value.strip()
    except OSError:
        pass
    flags = set(info.get("flags", "").split())
    return {
        "name": info.get("model name", "unknown CPU"),
        "family": int(info["cpu family"]) if "cpu family" in info else None,
        "model": int(info["model"]) if "model" in info else None,
        "cpus": os.cpu_count(),
        "flags": {f: f in flags for f in FLAGS},
    }


def commit() -> dict:
    """The checkout's commit, and whether it had uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False).stdout.strip()

    return {"commit": git("rev-parse", "--short=12", "HEAD") or "unknown", "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def version(package: str) -> Optional[str]:
    """An installed Python package's version, None if it is not installed here."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def row(workload: str, attend: float, peer: str, peer_value: float, better: str = "lower", **extra: object) -> dict:
    """One row: attend's figure and a peer's on the same workload. ``ratio`` is how
    many times better attend did: the peer's time over attend's when lower is
    better, attend's rate over the peer's when higher is."""
    ratio = peer_value / attend if better == "lower" else attend / peer_value
    return {"workload": workload, "attend": attend, "peer": peer, "peer_value": peer_value, "ratio": ratio, **extra}


def results_dir() -> Path:
    return Path(os.environ.get("ATTEND_BENCH_RESULTS", ROOT / "bench" / "results"))


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def write(
    script: str,
    title: str,
    *,
    unit: str,
    better: str,
    threads: int,
    peers: Dict[str, Optional[str]],
    rows: List[dict],
    peaks: Optional[Dict[str, float]] = None,
    args: Optional[List[str]] = None,
    other_load: Optional[float] = None,
    notes: Optional[str] = None,
) -> Path:
    """Writes the record and returns its path (also printed to stderr)."""
    if better not in ("lower", "higher"):
        raise ValueError(f"better must be 'lower' or 'higher', not {better!r}")
    if not rows:
        raise ValueError("a record needs at least one row")
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    here = cpu()
    rev = commit()
    record = {
        "schema": SCHEMA,
        "script": script,
        "args": list(args if args is not None else sys.argv[1:]),
        "title": title,
        "date": now.isoformat().replace("+00:00", "Z"),
        **rev,
        "cpu": here,
        "threads": threads,
        "peaks": peaks or {},
        "other_load": other_load,
        # The 1-minute load average as the record is written: how quiet the machine was.
        "load_average": round(os.getloadavg()[0], 2),
        "peers": peers,
        "unit": unit,
        "better": better,
        "rows": rows,
        "notes": notes,
    }
    out = results_dir()
    out.mkdir(parents=True, exist_ok=True)
    name = f"{now:%Y-%m-%dT%H%M%SZ}-{script}-{slug(here['name'])}-f{here['family']}m{here['model']}-{rev['commit'][:7]}"
    path = out / f"{name}.json"
    n = 1
    while path.exists():
        n += 1
        path = out / f"{name}-{n}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"record: {path}", file=sys.stderr)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description="Writes a record from tab-separated rows on stdin (see the module's doc).")
    p.add_argument("--script", required=True)
    p.add_argument("--title", required=True)
    p.add_argument("--unit", required=True)
    p.add_argument("--better", choices=("lower", "higher"), required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--peer", action="append", default=[], help="NAME=VERSION, once per peer")
    p.add_argument("--peak", action="append", default=[], help="NAME=GFLOPS, e.g. f32_gflops=482")
    p.add_argument("--notes")
    p.add_argument("--args", nargs=argparse.REMAINDER, default=[], help="the benchmark's own arguments")
    a = p.parse_args()
    rows = []
    for n, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        fields = line.rstrip("\n").split("\t")
        if len(fields) not in (4, 5):
            raise SystemExit(f"record.py: row {n}: expected workload, attend, peer, peer's figure[, share of peak], got {fields}")
        extra = {"share_of_peak": float(fields[4])} if len(fields) == 5 else {}
        rows.append(row(fields[0], float(fields[1]), fields[2], float(fields[3]), a.better, **extra))
    peers = dict(p.split("=", 1) for p in a.peer)
    peaks = {k: float(v) for k, v in (p.split("=", 1) for p in a.peak)}
    write(a.script, a.title, unit=a.unit, better=a.better, threads=a.threads, peers=peers, rows=rows,
          peaks=peaks, args=a.args, notes=a.notes)


if __name__ == "__main__":
    main()
