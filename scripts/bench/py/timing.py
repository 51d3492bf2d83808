"""The timing rule of every Python side of the benchmarks here (torch_sdpa.py,
the ONNX Runtime and OpenVINO drivers, ...) and of `attend bench`: a warm-up
call, then at least `min_runs` runs and `min_time` seconds, the median."""
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


def median_ms(fn, reps):
    """The median milliseconds of `reps` calls of `fn`, with no warm-up: for the
    model benchmarks, which warm every side up once and then alternate rounds."""
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)
