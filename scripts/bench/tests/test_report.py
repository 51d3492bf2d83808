"""scripts/bench/report: the committed docs/speed.md and charts are what the
renderer makes of the committed records, byte for byte; records are written as
record.py says; the charts open in Chromium and name what they show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts" / "bench" / "py"))

import record  # noqa: E402
import report  # noqa: E402

RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs"
SVG = "{http://www.w3.org/2000/svg}"


def rendered(tmp_path: Path) -> Path:
    out = tmp_path / "docs"
    subprocess.run([str(ROOT / "scripts" / "bench" / "report"), "--docs", str(out)], check=True, capture_output=True)
    return out


def test_committed_speed_page_and_charts_are_the_renderers(tmp_path):
    out = rendered(tmp_path)
    assert (out / "speed.md").read_text() == (DOCS / "speed.md").read_text()
    made = sorted(p.name for p in (out / "img").glob("speed-*.svg"))
    committed = sorted(p.name for p in (DOCS / "img").glob("speed-*.svg"))
    assert made == committed, "docs/img holds a chart no record makes, or lacks one"
    for name in made:
        assert (out / "img" / name).read_bytes() == (DOCS / "img" / name).read_bytes(), name


def test_every_record_is_on_the_page_with_every_row():
    page = (DOCS / "speed.md").read_text()
    records = report.load(RESULTS)
    assert records, "bench/results holds no record"
    for r in records:
        assert f"Record `{r['file']}`" in page
        for row in r["rows"]:
            assert f"| {row['workload']} | {report.fmt(row['attend'])} | {row['peer']} | {report.fmt(row['peer_value'])} | {row['ratio']:.2f}× |" in page


def test_no_time_of_day_in_the_readme_or_the_docs():
    for path in [ROOT / "README.md", *DOCS.glob("*.md")]:
        assert "UTC" not in path.read_text(), f"{path.name} names a time of day; a figure points at its record instead"


def test_a_record_holds_the_cpu_the_commit_the_peers_and_ratios_both_ways(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTEND_BENCH_RESULTS", str(tmp_path))
    slow = record.row("B1 N512", 2.0, "torch", 5.0, better="lower")
    fast = record.row("corpus", 300.0, "onnxruntime", 200.0, better="higher")
    assert slow["ratio"] == 2.5 and fast["ratio"] == 1.5
    path = record.write("vs-x", "a title", unit="ms", better="lower", threads=2, peers={"torch": "2.15.0"},
                        rows=[slow], peaks={"f32_gflops": 480.0}, args=["--quick"])
    r = json.loads(path.read_text())
    assert r["cpu"]["name"] and set(r["cpu"]["flags"]) == set(record.FLAGS)
    assert r["commit"] and r["peers"] == {"torch": "2.15.0"} and r["args"] == ["--quick"]
    assert r["rows"] == [slow] and r["date"].endswith("Z")
    with pytest.raises(ValueError):
        record.write("vs-x", "t", unit="ms", better="sideways", threads=2, peers={}, rows=[slow])


def test_cpus_are_ordered_by_their_newest_record_and_records_newest_first(tmp_path):
    def rec(name: str, date: str, title: str, avx512: bool, rows: int = 1) -> dict:
        flags = {f: False for f in record.FLAGS}
        flags.update(avx2=True, avx512f=avx512)
        return {"schema": 1, "script": "vs-x", "args": [], "title": title, "date": date, "commit": "abcdef123456",
                "dirty": False, "cpu": {"name": name, "family": 25, "model": 17, "cpus": 2, "flags": flags},
                "threads": 2, "peaks": {}, "other_load": None, "load_average": 0.1, "peers": {"torch": "2.15.0"},
                "unit": "ms", "better": "lower", "notes": None,
                "rows": [record.row(f"w{i}", 1.0, "torch", 2.0) for i in range(rows)]}

    results = tmp_path / "results"
    results.mkdir()
    for i, (name, date, title, avx512) in enumerate([
        ("Old CPU", "2026-11-20T10:00:00Z", "first", False),
        ("New CPU", "2026-11-25T10:00:00Z", "older", True),
        ("New CPU", "2026-11-26T10:00:00Z", "newer", True),
    ]):
        (results / f"{i}.json").write_text(json.dumps(rec(name, date, title, avx512)))
    report.render(results, tmp_path / "docs")
    page = (tmp_path / "docs" / "speed.md").read_text()
    assert page.index("## New CPU") < page.index("## Old CPU")
    assert page.index("### newer") < page.index("### older")
    headline = (tmp_path / "docs" / "img" / "speed-headline.svg").read_text()
    assert "New CPU" in headline and "Old CPU" not in headline
    assert "AVX2 only" in (tmp_path / "docs" / "img" / "speed-old-cpu-f25m17-avx2.svg").read_text()

    # A CPU measured since on fewer workloads gets its own chart and the page's
    # first section, not the headline; one measured on as many or more does.
    (results / "3.json").write_text(json.dumps(rec("Newest CPU", "2026-11-27T10:00:00Z", "once", True)))
    report.render(results, tmp_path / "docs")
    page = (tmp_path / "docs" / "speed.md").read_text()
    assert page.index("## Newest CPU") < page.index("## New CPU")
    headline = (tmp_path / "docs" / "img" / "speed-headline.svg").read_text()
    assert "New CPU" in headline and "Newest CPU" not in headline
    (results / "3.json").write_text(json.dumps(rec("Newest CPU", "2026-11-27T10:00:00Z", "once", True, rows=2)))
    report.render(results, tmp_path / "docs")
    assert "Newest CPU" in (tmp_path / "docs" / "img" / "speed-headline.svg").read_text()


def chromium() -> str | None:
    path = os.environ.get("ATTEND_CHROMIUM", "/usr/bin/chromium")
    if Path(path).exists():
        return path
    if os.environ.get("CI"):
        pytest.fail("/usr/bin/chromium is missing; run scripts/setup.d/browser")
    pytest.skip("no /usr/bin/chromium (run scripts/setup.d/browser)")
    return None


@pytest.mark.parametrize("chart", sorted(p.name for p in (DOCS / "img").glob("speed-*.svg")))
def test_charts_open_in_chromium_and_name_the_cpu_the_peers_and_the_axis(tmp_path, chart):
    svg = DOCS / "img" / chart
    tree = ET.parse(svg)
    texts = " ".join("".join(t.itertext()) for t in tree.iter(f"{SVG}text"))
    slug = chart.removeprefix("speed-").removesuffix(".svg")
    records = report.load(RESULTS)
    if slug == "headline":
        by_cpu, order = report.by_cpu_newest_first(records)
        mine = by_cpu[report.headline_cpu(by_cpu, order)]
    else:
        mine = [r for r in records if report.cpu_slug(r) == slug]
    assert mine, f"{chart}: no record of its CPU"
    assert report.cpu_title(mine[0]) in texts
    assert "speed-up over the peer" in texts and "share of the peak" in texts
    for r in report.newest_per_title(mine):
        for row in r["rows"]:
            assert f"{row['workload']} vs {row['peer']}" in texts

    width, height = int(tree.getroot().get("width")), int(tree.getroot().get("height"))
    shot = tmp_path / "chart.png"
    subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
         f"--window-size={width},{height}", svg.as_uri()],
        check=True, capture_output=True, timeout=120,
    )
    pixels = rgb_pixels(shot.read_bytes())
    # The bars (attend ahead: blue, behind: orange) and the black axis and text.
    bars = sum(pixels.count(c) for c in ((0x2B, 0x7B, 0xBA), (0xD9, 0x5F, 0x02)))
    assert bars >= 16 * 20 * sum(len(r["rows"]) for r in report.newest_per_title(mine)) // 2, "the bars are not drawn"
    assert pixels.count((0, 0, 0)) > 200, "no axis or text drawn"


def rgb_pixels(png: bytes) -> list:
    """The pixels of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium's
    screenshots are), as (r, g, b) tuples."""
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    pos, idat, header = 8, b"", None
    while pos < len(png):
        length = int.from_bytes(png[pos : pos + 4], "big")
        kind, data = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = data
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    width, height = int.from_bytes(header[0:4], "big"), int.from_bytes(header[4:8], "big")
    depth, colour, interlace = header[8], header[9], header[12]
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    out, prev = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        out.extend(tuple(line[i : i + 3]) for i in range(0, stride, bpp))
        prev = line
    return out


def test_a_run_is_busy_by_what_others_took_where_measured_else_by_the_load_average():
    def rec(other_load, load_average):
        return {"other_load": other_load, "load_average": load_average, "cpu": {"cpus": 2}}

    # A server benchmark's own threads push the load average past the CPUs.
    assert not report.busy(rec(0.01, 2.8))
    assert report.busy(rec(0.15, 1.0))
    assert report.busy(rec(None, 2.5)) and not report.busy(rec(None, 1.5))
