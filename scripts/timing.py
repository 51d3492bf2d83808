"""The timing rule every Python benchmark side here shares with
shared/bench/torch_sdpa.py: a warm-up call, then at least `min_runs` runs and
`min_time` seconds, the median."""
import statistics
import time


def median_seconds(fn, min_runs=5, min_time=0.5):
    fn()
    times, t_end = [], time.perf_counter() + min_time
    while len(times) < min_runs or time.perf_counter() < t_end:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)
