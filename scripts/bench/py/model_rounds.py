"""What the model benchmarks from Python (bench_py_models.py, bench_long_prompt.py)
share: the CPU's name (which bench_ort.py and bench_py.py print too), the share of
the CPU other processes took meanwhile, and
alternating rounds of two sides, each round's time the median of a few calls
(timing.median_ms)."""

from __future__ import annotations

import os
import subprocess
from typing import Callable, Dict, List, Optional

from timing import median_ms


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU (lscpu unavailable)"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


class OtherLoad:
    """How much CPU other processes took while the benchmark ran: /proc/stat's busy
    time minus this process's own, as a share of all CPUs (Linux only)."""

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample():
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
            with open("/proc/self/stat") as f:
                own = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        idle = fields[3] + fields[4]
        # This process's time and that of the children it has waited for (the
        # `attend embed` runs a benchmark starts are its own work, not others').
        return sum(fields) - idle, sum(fields), sum(int(x) for x in own[11:15])

    def share(self) -> Optional[float]:
        end = self._sample()
        if self.start is None or end is None or end[1] == self.start[1]:
            return None
        busy, total, own = (b - a for a, b in zip(self.start, end))
        return max(0.0, (busy - own) / total)

    def report(self) -> None:
        """Prints the load average and the other processes' share since the start,
        with a warning above 5 % of the CPUs: such timings are not trustworthy."""
        print(f"load average after: {os.getloadavg()}")
        share = self.share()
        if share is not None:
            print(f"CPU taken by other processes during the run: {100 * share:.0f}% of all CPUs")
            if share > 0.05:
                print("WARNING: the machine was not quiet; these timings are not trustworthy")


def alternate(
    sides: Dict[str, Callable[[], object]], rounds: int, reps: int, warmup: int = 2
) -> Dict[str, List[float]]:
    """Per-round medians of each side (ms); the order of the sides flips every round.
    Each side is called `warmup` times first (allocators, thread pools, lazy
    initialisation)."""
    names = list(sides)
    for name in names:
        for _ in range(warmup):
            sides[name]()
    result: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            result[name].append(median_ms(sides[name], reps))
    return result
