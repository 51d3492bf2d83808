"""scripts/bench/report's renderer: the records in bench/results/ (record.py writes
them) into docs/speed.md and one SVG chart per CPU in docs/img/, plus
docs/img/speed-headline.svg (the chart of the CPU whose records chart the most
workloads, the newest of those where several do), which the README shows: a CPU
measured once, on one workload, does not take the README's chart from the one
measured across them all. The output depends on the records alone, so the same records
give the same files byte for byte (a test checks the committed ones).

    python3 scripts/bench/py/report.py [--results DIR] [--docs DIR]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from html import escape
from pathlib import Path
from typing import Dict, List, Tuple

import record

ROOT = Path(__file__).resolve().parents[3]
FLAG_NAMES = {
    "avx512f": "AVX-512",
    "avx512_bf16": "AVX512-BF16",
    "avx512_vnni": "AVX512-VNNI",
    "avx_vnni": "AVX-VNNI",
    "amx_tile": "AMX",
}


def load(results: Path) -> List[dict]:
    records = []
    for path in sorted(results.glob("*.json")):
        r = json.loads(path.read_text())
        if r.get("schema") != 1:
            raise SystemExit(f"{path}: unknown record schema {r.get('schema')!r}")
        r["file"] = path.name
        records.append(r)
    return records


def cpu_key(r: dict) -> Tuple[str, object, object, Tuple[str, ...]]:
    c = r["cpu"]
    return (c["name"], c["family"], c["model"], tuple(sorted(f for f, on in c["flags"].items() if on)))


def cpu_title(r: dict) -> str:
    c = r["cpu"]
    on = [name for flag, name in FLAG_NAMES.items() if c["flags"].get(flag)]
    isa = ", ".join(on) if on else ("AVX2 only" if c["flags"].get("avx2") else "no AVX2")
    return f"{c['name']} (family {c['family']}, model {c['model']}; {isa}; {c['cpus']} CPUs)"


def cpu_slug(r: dict) -> str:
    c = r["cpu"]
    flags = "avx512" if c["flags"].get("avx512f") else "avx2" if c["flags"].get("avx2") else "base"
    return f"{record.slug(c['name'])}-f{c['family']}m{c['model']}-{flags}"


def fmt(x: float) -> str:
    """Figures with three significant digits, without exponents."""
    if x == 0:
        return "0"
    digits = max(0, 2 - int(f"{abs(x):e}".split("e")[1]))
    return f"{x:.{digits}f}"


def peers_line(r: dict) -> str:
    return ", ".join(f"{name} {v}" if v else name for name, v in sorted(r["peers"].items()))


def busy(r: dict) -> bool:
    """Whether other work shared the machine: by the share of the CPUs other
    processes took where the script measured it, else by the load average (which
    also counts the benchmark's own threads: a server and its load generator pass
    the CPU count by themselves)."""
    if r.get("other_load") is not None:
        return r["other_load"] > 0.05
    return r["load_average"] > r["cpu"]["cpus"]


def context(r: dict) -> str:
    parts = [f"`scripts/bench/{r['script']}{(' ' + ' '.join(r['args'])) if r['args'] else ''}`",
             f"commit {r['commit'][:7]}{' (with uncommitted changes)' if r['dirty'] else ''}",
             f"{r['threads']} threads"]
    for name, gflops in sorted(r["peaks"].items()):
        parts.append(f"{name.replace('_gflops', '')} peak {fmt(gflops)} GFLOP/s")
    if r.get("other_load") is not None:
        parts.append(f"other processes took {100 * r['other_load']:.0f} % of the CPUs")
    parts.append(f"load average {r['load_average']:.1f} at its end")
    if busy(r):
        parts.append("**other work shared the machine: the shares of the peak, and the ratios less so, are not to be trusted**")
    if r["peers"]:
        parts.append(f"peers: {peers_line(r)}")
    return "; ".join(parts)


def table(r: dict) -> List[str]:
    share = any("share_of_peak" in row for row in r["rows"])
    head = ["workload", f"attend ({r['unit']})", "peer", f"peer ({r['unit']})", "attend's ratio"] + (["attend's share of peak"] if share else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in r["rows"]:
        cells = [row["workload"], fmt(row["attend"]), row["peer"], fmt(row["peer_value"]), f"{row['ratio']:.2f}×"]
        if share:
            cells.append(f"{100 * row['share_of_peak']:.0f} %" if "share_of_peak" in row else "")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def newest_per_title(records: List[dict]) -> List[dict]:
    """The newest record of each script and title, newest first."""
    seen: Dict[Tuple[str, str], dict] = {}
    for r in sorted(records, key=lambda r: r["date"], reverse=True):
        seen.setdefault((r["script"], r["title"]), r)
    return list(seen.values())


# -- the chart -------------------------------------------------------------------

BAR_H, GAP, PLOT_W, VALUE_W, SHARE_W, PAD = 16, 4, 360, 56, 150, 12
# The chart's ratio axis ends here at most (see `chart`).
AXIS_CAP = 8.0
# About the width of a character of the labels' 11 px sans-serif, generously.
CHAR_W = 6.6


def ticks(top: float) -> Tuple[float, List[float]]:
    """The axis's end and its ticks: at most 8, a step of 0.5, 1, 2, 5, 10, 20 or 50."""
    step = next((st for st in (0.5, 1.0, 2.0, 5.0, 10.0, 20.0) if top / st <= 7), 50.0)
    end = step * (int(top / step) + 1)
    return end, [step * k for k in range(int(round(end / step)) + 1)]


def chart(records: List[dict]) -> str:
    """Horizontal bars of attend's ratio against each peer for every row of the
    CPU's newest record per script and title, 1× marked, and attend's share of the
    peak beside where the record has it."""
    groups = newest_per_title(records)
    rows = [row for g in groups for row in g["rows"]]
    # Ratios of tens (a peer far off its fast path) would squeeze every other bar
    # into a few pixels: the axis stops at AXIS_CAP, and a longer bar ends there
    # with its value written beside it.
    end, marks = ticks(min(max(max(row["ratio"] for row in rows), 1.0), AXIS_CAP))
    height = PAD * 2 + 56 + len(groups) * 22 + len(rows) * (BAR_H + GAP) + 34
    label_w = int(max(CHAR_W * len(f"{row['workload']} vs {row['peer']}") for row in rows)) + 12
    subtitle = ("attend against each peer, same run: how many times faster (bars; right of the dashed line, "
                "attend is ahead), and attend's share of the FMA peak")
    width = max(PAD * 2 + label_w + PLOT_W + VALUE_W + SHARE_W, int(CHAR_W * len(subtitle)) + 2 * PAD)
    x0 = PAD + label_w
    sx = x0 + PLOT_W + VALUE_W + 40

    def x_of(ratio: float) -> float:
        return x0 + PLOT_W * min(ratio, end) / end

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="DejaVu Sans, Arial, sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{PAD}" y="{PAD + 12}" font-size="13" font-weight="bold">{escape(cpu_title(records[0]))}</text>',
        f'<text x="{PAD}" y="{PAD + 28}" fill="#444">{escape(subtitle)}</text>',
    ]
    y = PAD + 56
    for g in groups:
        out.append(f'<text x="{PAD}" y="{y + 12}" font-weight="bold">{escape(g["title"])} ({escape(g["unit"])}, '
                   f'{g["date"][:10]}, {escape(g["commit"][:7])})</text>')
        y += 22
        first = y
        for row in g["rows"]:
            x = x_of(row["ratio"])
            colour = "#2b7bba" if row["ratio"] >= 1 else "#d95f02"
            out.append(f'<text x="{x0 - 6}" y="{y + 12}" text-anchor="end">{escape(row["workload"])} vs {escape(row["peer"])}</text>')
            out.append(f'<rect x="{x0}" y="{y}" width="{x - x0:.1f}" height="{BAR_H}" fill="{colour}"/>')
            out.append(f'<text x="{x + 4:.1f}" y="{y + 12}">{row["ratio"]:.2f}×</text>')
            if "share_of_peak" in row:
                share = row["share_of_peak"]
                out.append(f'<rect x="{sx}" y="{y + 3}" width="{(SHARE_W - 50) * min(share, 1.0):.1f}" height="{BAR_H - 6}" fill="#999"/>')
                out.append(f'<text x="{sx - 4}" y="{y + 12}" text-anchor="end" fill="#444">{100 * share:.0f} %</text>')
            y += BAR_H + GAP
        out.append(f'<line x1="{x_of(1.0):.1f}" y1="{first - 2}" x2="{x_of(1.0):.1f}" y2="{y}" stroke="black" stroke-dasharray="3,3"/>')
    out.append(f'<line x1="{x0}" y1="{y}" x2="{x0 + PLOT_W}" y2="{y}" stroke="black"/>')
    for m in marks:
        x = x_of(m)
        out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="black"/>')
        out.append(f'<text x="{x:.1f}" y="{y + 16}" text-anchor="middle">{m:g}×</text>')
    out.append(f'<text x="{x0 + PLOT_W / 2:.1f}" y="{y + 30}" text-anchor="middle">attend\'s speed-up over the peer</text>')
    out.append(f'<text x="{sx}" y="{y + 16}" fill="#444">share of the peak</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# -- the page --------------------------------------------------------------------


def page(by_cpu: Dict[tuple, List[dict]], order: List[tuple], slugs: Dict[tuple, str]) -> str:
    lines = [
        "# Speed",
        "",
        "<!-- Generated by scripts/bench/report from bench/results/: do not edit. -->",
        "",
        "Every figure here comes from a record in [bench/results/](../bench/results/),",
        "written by the benchmark script that measured it (`scripts/bench/README.md`",
        "lists them). Each table names its record, the script and arguments that made it,",
        "the commit and the peers' versions, so anyone can measure it again. A ratio is how",
        "many times better attend did than the peer in the same run (its time over",
        "attend's, or attend's rate over its): above 1, attend is ahead. CPUs are listed",
        "newest record first, and within a CPU the records newest first.",
        "",
    ]
    for key in order:
        recs = sorted(by_cpu[key], key=lambda r: r["date"], reverse=True)
        lines += [f"## {cpu_title(recs[0])}", "", f"![attend against its peers on this CPU](img/speed-{slugs[key]}.svg)", ""]
        for r in recs:
            lines += [f"### {r['title']}", "", f"Record `{r['file']}`: {context(r)}.", ""]
            if r.get("notes"):
                lines += [r["notes"], ""]
            lines += table(r) + [""]
    return "\n".join(lines).rstrip() + "\n"


def headline_cpu(by_cpu: Dict[tuple, List[dict]], order: List[tuple]) -> tuple:
    """The CPU of the README's chart: the one whose records chart the most
    workloads, the first in `order` (newest record first) of equals."""
    return max(order, key=lambda k: sum(len(g["rows"]) for g in newest_per_title(by_cpu[k])))


def by_cpu_newest_first(records: List[dict]) -> tuple:
    """The records grouped by CPU, and the CPUs ordered by their newest record."""
    by_cpu: Dict[tuple, List[dict]] = defaultdict(list)
    for r in records:
        by_cpu[cpu_key(r)].append(r)
    order = sorted(by_cpu, key=lambda k: max(r["date"] for r in by_cpu[k]), reverse=True)
    return by_cpu, order


def render(results: Path, docs: Path) -> List[Path]:
    records = load(results)
    if not records:
        raise SystemExit(f"no records in {results}")
    by_cpu, order = by_cpu_newest_first(records)
    slugs = {k: cpu_slug(by_cpu[k][0]) for k in order}
    img = docs / "img"
    img.mkdir(parents=True, exist_ok=True)
    written = []
    for k in order:
        path = img / f"speed-{slugs[k]}.svg"
        path.write_text(chart(by_cpu[k]))
        written.append(path)
    headline = img / "speed-headline.svg"
    headline.write_text(chart(by_cpu[headline_cpu(by_cpu, order)]))
    speed = docs / "speed.md"
    speed.write_text(page(by_cpu, order, slugs))
    return [speed, headline, *written]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--docs", type=Path, default=ROOT / "docs")
    a = p.parse_args()
    for path in render(a.results, a.docs):
        print(path)


if __name__ == "__main__":
    main()
