"""scripts/bench/serve's driver: embedding servers under load over loopback, measured
with oha, alternating sides within one run. See scripts/bench/serve for what it
reports; this file starts and stops the servers, runs oha and prints the results.

Fairness. Every server is started on 127.0.0.1 with the same model directory, f32
and the same thread count; while one side is measured, the other servers are
stopped with SIGSTOP (and continued after), so an idle server's housekeeping never
takes the measured side's cores. oha shares the cores with the server; its CPU time
is reported. One text per request, OpenAI's ``POST /v1/embeddings`` with
``encoding_format: float`` on every side.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

import record

SHORT_TEXT = "What is a vector search query?"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine_cpu() -> "tuple[float, float]":
    """(busy, all) CPU seconds of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        # user nice system idle iowait irq softirq steal (guest time is inside user)
        fields = [int(x) for x in f.readline().split()[1:9]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / tick, sum(fields) / tick


def http_json(url: str, timeout: float = 10) -> object:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


class Server:
    """One server process (and its process group), started on 127.0.0.1."""

    def __init__(
        self, label: str, argv: List[str], env: Dict[str, str], log_path: Path, port: Optional[int], ready_path: str
    ) -> None:
        self.label = label
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.port = port
        self.ready_path = ready_path
        self.proc: Optional[subprocess.Popen] = None
        self.base = ""
        self.model = ""
        self.served = 0  # requests answered so far, by oha's count
        self.rss_at: List[int] = []  # the request counts its RSS is read after

    def start(self, timeout_s: float) -> None:
        """Starts the process and waits until its ready path answers 200. Without a
        port the server picks one and prints ``listening on http://HOST:PORT``."""
        log(f"starting {self.label}: {' '.join(self.argv)}")
        out = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        # For scripts/bench/serve's trap, should this process die before stopping it.
        with open(self.log_path.parent / "server-pgids", "a") as pgids:
            pgids.write(f"{self.proc.pid}\n")
        deadline = time.monotonic() + timeout_s
        if self.port is not None:
            self.base = f"http://127.0.0.1:{self.port}"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.label} exited with {self.proc.returncode}; its log: {self.log_path}")
            if not self.base:
                found = re.search(rb"listening on (http://[0-9.]+:[0-9]+)", self.log_path.read_bytes())
                if found:
                    self.base = found.group(1).decode()
            if self.base and http_ok(self.base + self.ready_path):
                try:
                    self.model = http_json(self.base + "/v1/models")["data"][0]["id"]
                except OSError:  # text-embeddings-inference has no /v1/models; /info names its model
                    self.model = http_json(self.base + "/info")["model_id"]
                log(f"{self.label} ready at {self.base}, model {self.model!r}")
                return
            time.sleep(0.25)
        raise SystemExit(f"{self.label} was not ready within {timeout_s:.0f} s; its log: {self.log_path}")

    def pids(self) -> List[int]:
        """The processes of the server's process group."""
        if self.proc is None:
            return []
        out = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.proc.pid:  # the process group id
                out.append(int(stat.parent.name))
        return out

    def rss_mib(self) -> "tuple[float, float, int]":
        """Resident memory (VmRSS), MiB: of the server process itself, and of the
        other processes of its group (e.g. torch.compile's workers) and how many."""
        main, rest, n = 0.0, 0.0, 0
        for pid in self.pids():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
            mib = int(found.group(1)) / 1024 if found else 0.0
            if pid == self.proc.pid:
                main = mib
            else:
                rest, n = rest + mib, n + 1
        return main, rest, n

    def cpu_s(self) -> float:
        """CPU time (user + system) of the server's processes so far, seconds."""
        ticks = 0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        log(f"{self.label} stopped (exit {self.proc.returncode})")


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.servers: List[Server] = []
        self.oha_cpu_s = 0.0
        self.oha_wall_s = 0.0
        self.embed_cpu_s = 0.0
        self.overload_cpu_s = 0.0  # the overload phase's own server

    # -- oha ---------------------------------------------------------------------

    def oha(self, server: Server, extra: List[str], bodies: Optional[Path], body: Optional[str]) -> dict:
        """One oha run against ``server``'s /v1/embeddings; returns
        ``{ok, total, seconds, rps_ok, p50_ms, p99_ms, other}``."""
        argv = [self.args.oha, "--no-tui", "--output-format", "json", "-m", "POST", "-T", "application/json"]
        argv += ["-Z", str(bodies)] if bodies is not None else ["-d", body or ""]
        argv += ["-t", "120s", *extra, server.base + "/v1/embeddings"]
        # GNU time reports oha's own CPU time (user, system) and wall time.
        times = self.work / "oha-times"
        argv = ["/usr/bin/time", "-f", "%e %U %S", "-o", str(times), *argv]
        run = subprocess.run(argv, capture_output=True, text=True, timeout=self.args.oha_timeout, check=False)
        if run.returncode != 0:
            raise SystemExit(f"oha failed ({run.returncode}): {run.stderr.strip()[-500:]}")
        wall, user, system = (float(x) for x in times.read_text().split()[-3:])
        self.oha_cpu_s += user + system
        self.oha_wall_s += wall
        out = json.loads(run.stdout)
        codes = {k: v for k, v in out["statusCodeDistribution"].items()}
        ok = codes.pop("200", 0)
        other = dict(codes)
        # Requests still in flight when -z's time is up are cut off by oha, not refused.
        aborted = out["errorDistribution"].pop("aborted due to deadline", 0)
        other.update(out["errorDistribution"])
        server.served += ok + sum(codes.values()) + aborted
        seconds = out["summary"]["total"]
        return {
            "ok": ok,
            "seconds": seconds,
            "rps_ok": ok / seconds if seconds else 0.0,
            "p50_ms": out["metrics"]["latency_ms"]["p50"],
            "p99_ms": out["metrics"]["latency_ms"]["p99"],
            "other": other,
        }

    def bodies(self, server: Server) -> Path:
        return self.work / f"bodies-{self.servers.index(server)}.jsonl"

    def short_body(self, server: Server) -> str:
        return json.dumps({"model": server.model, "input": [SHORT_TEXT], "encoding_format": "float"})

    # -- isolation ---------------------------------------------------------------

    def only(self, active: Optional[Server]) -> None:
        """Continues ``active`` and stops every other server (SIGSTOP)."""
        for s in self.servers:
            s.signal(signal.SIGCONT if s is active else signal.SIGSTOP)

    # -- phases ------------------------------------------------------------------

    def saturation(self, server: Server) -> dict:
        self.only(server)
        # -w: the requests in flight at the deadline are waited for and counted.
        extra = ["-z", f"{self.args.seconds}s", "-w", "-c", str(self.args.connections)]
        r = self.oha(server, extra, self.bodies(server), None)
        log(f"  {server.label}: {r['rps_ok']:.1f} texts/s (non-200/errors: {r['other'] or 'none'})")
        return r

    def embed_cli(self) -> float:
        """``attend embed --input`` over the texts: texts/s, its start-up (the median
        time of a one-text run, measured once) taken out."""
        self.only(None)
        seconds = self._embed_seconds(self.work / "texts.txt")
        rate = self.n_texts / max(seconds - self.embed_startup_s, 1e-9)
        log(f"  attend embed: {rate:.1f} texts/s ({seconds:.2f} s, start-up {self.embed_startup_s:.2f} s taken out)")
        return rate

    def _embed_seconds(self, path: Path) -> float:
        argv = [self.args.attend, "embed", "--model", self.args.model, "--precision", "f32"]
        argv += ["--input", str(path), "--output", str(self.work / "embed.npy")]
        if self.embed_has_threads:
            argv += ["--threads", str(self.args.threads)]
        env = dict(os.environ, RAYON_NUM_THREADS=str(self.args.threads))
        times = self.work / "embed-times"
        argv = ["/usr/bin/time", "-f", "%e %U %S", "-o", str(times), *argv]
        run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=self.args.oha_timeout, check=False)
        if run.returncode != 0:
            raise SystemExit(f"attend embed failed ({run.returncode}): {run.stderr.strip()[-500:]}")
        wall, user, system = (float(x) for x in times.read_text().split()[-3:])
        self.embed_cpu_s += user + system
        return wall

    def serve_until(self, server: Server, total: int) -> None:
        """Sends the mix at saturation until ``server`` has answered ``total`` requests."""
        left = total - server.served
        if left > 0:
            self.only(server)
            log(f"  {server.label}: {left} more requests, to {total}")
            self.oha(server, ["-n", str(left), "-c", str(self.args.connections)], self.bodies(server), None)

    def latency(self, server: Server, rate: float, bodies: Optional[Path], body: Optional[str]) -> dict:
        """p50/p99 at a constant request rate, latency-corrected (a request's time
        counts from when the schedule meant to send it)."""
        self.only(server)
        extra = ["-z", f"{self.args.seconds}s", "-w", "-c", str(self.args.latency_connections), "-q", f"{rate:.2f}"]
        extra.append("--latency-correction")
        return dict(self.oha(server, extra, bodies, body), rate=rate)

    def overload(self, attend: Server, rate_per_s: float) -> dict:
        """A second attend server with a small queue bound, sent the mix at
        ``rate_per_s`` (twice its saturation) from many connections: how many
        requests were answered, refused (429/503) or failed otherwise, and the p99
        of the answered ones from when oha sent each (its per-request records):
        past saturation oha cannot keep its schedule, and a request that waits in
        oha for a connection has not reached the server."""
        a = self.args
        bound = Server(
            f"attend serve --max-queue-tokens {a.overload_queue_tokens}",
            [*attend.argv, "--max-queue-tokens", str(a.overload_queue_tokens)],
            attend.env, self.work / "attend-serve-overload.log", None, "/ready",
        )
        bound.start(a.start_timeout)
        bound.model = attend.model
        self.servers.append(bound)
        try:
            self.only(bound)
            db = self.work / "overload.db"
            extra = ["-z", f"{a.seconds}s", "-w", "-c", str(a.overload_connections), "-q", f"{rate_per_s:.2f}",
                     "--latency-correction", "--db-url", str(db)]
            r = self.oha(bound, extra, self.bodies(attend), None)
            with sqlite3.connect(db) as c:
                answered = sorted(d for (d,) in c.execute("SELECT duration FROM oha WHERE status = 200"))
        finally:
            self.overload_cpu_s += bound.cpu_s()
            bound.stop()
            self.servers.remove(bound)
        p99 = answered[min(len(answered) - 1, int(0.99 * len(answered)))] * 1e3 if answered else float("nan")
        return dict(r, rate=rate_per_s, p99_answered_ms=p99)

    def run(self, servers: List[Server], with_embed: bool) -> None:
        a = self.args
        phases = set(a.phases)
        with_embed = with_embed and "throughput" in phases
        self.servers = servers
        texts = self.work / "texts.txt"
        self.n_texts = sum(1 for _ in texts.open())
        self.embed_has_threads = with_embed and "--threads" in subprocess.run(
            [a.attend, "embed", "--help"], capture_output=True, text=True, check=False
        ).stdout
        for s in servers:
            subprocess.run(
                [sys.executable, str(Path(__file__).with_name("serve_texts.py")), "bodies", str(texts), s.model, str(self.bodies(s))],
                check=True,
            )
        for s in servers:
            s.rss_at = a.rss if s.label.startswith("attend") else a.peer_rss
        rss: Dict[str, list] = {s.label: [] for s in servers}
        machine0, servers0 = machine_cpu(), sum(s.cpu_s() for s in servers)
        self0 = time.process_time()

        log(f"warm-up ({a.warmup} requests each)" + (", then each server to its first RSS count" if "rss" in phases else ""))
        for s in servers:
            self.only(s)
            self.oha(s, ["-n", str(a.warmup), "-c", str(a.connections)], self.bodies(s), None)
            if "rss" in phases:
                self.serve_until(s, s.rss_at[0])
                rss[s.label].append(s.rss_mib())

        if with_embed:
            one = self.work / "one.txt"
            one.write_text(SHORT_TEXT + "\n")
            self.only(None)
            self.embed_startup_s = statistics.median(self._embed_seconds(one) for _ in range(3))

        rates: Dict[str, List[float]] = {s.label: [] for s in servers}
        rates["attend embed"] = []
        short_rates: Dict[str, float] = {}
        latency: Dict[str, Dict[str, Dict[int, dict]]] = {s.label: {"mix": {}, "short": {}} for s in servers}
        idle: Dict[str, Dict[str, dict]] = {s.label: {} for s in servers}
        oha_cores = 0.0
        if phases & {"throughput", "latency", "overload"}:
            log(f"saturation: {a.rounds} rounds of {a.seconds} s per side, -c {a.connections}, the order rotating")
            sides: List[object] = [*servers, *(["embed"] if with_embed else [])]
            oha_cpu0, oha_wall0 = self.oha_cpu_s, self.oha_wall_s
            for r in range(a.rounds):
                order = sides[r % len(sides) :] + sides[: r % len(sides)]
                for side in order:
                    if side == "embed":
                        rates["attend embed"].append(self.embed_cli())
                    else:
                        rates[side.label].append(self.saturation(side)["rps_ok"])
            oha_cores = (self.oha_cpu_s - oha_cpu0) / max(self.oha_wall_s - oha_wall0, 1e-9)

        if "latency" in phases:
            log(f"latency at 25/50/75 % of each side's saturation, constant rate, latency-corrected, {a.rounds} rounds "
                "(the median of the rounds' percentiles: one stall in a run moves its p99, not the figure)")
            log("short texts alone: first each side's saturation on them")
            for s in servers:
                self.only(s)
                extra = ["-z", f"{a.seconds}s", "-w", "-c", str(a.connections)]
                short_rates[s.label] = self.oha(s, extra, None, self.short_body(s))["rps_ok"]
            runs: Dict[str, Dict[str, Dict[int, List[dict]]]] = {
                s.label: {load: {pct: [] for pct in (25, 50, 75)} for load in ("mix", "short")} for s in servers
            }
            for r in range(a.rounds):
                for load in ("mix", "short"):
                    for pct in (25, 50, 75):
                        for s in servers[r % len(servers):] + servers[: r % len(servers)]:
                            if load == "mix":
                                res = self.latency(s, statistics.median(rates[s.label]) * pct / 100, self.bodies(s), None)
                            else:
                                res = self.latency(s, short_rates[s.label] * pct / 100, None, self.short_body(s))
                            runs[s.label][load][pct].append(res)
                            log(f"  round {r + 1} {s.label} {load} {pct}%: {res['rate']:.1f}/s p50 {res['p50_ms']:.2f} ms p99 {res['p99_ms']:.2f} ms")
            for s in servers:
                for load, levels in runs[s.label].items():
                    latency[s.label][load] = {pct: median_run(rs) for pct, rs in levels.items()}
            log(f"idle: one connection, {a.idle_requests} requests of one short text, then of the mix")
            for s in servers:
                self.only(s)
                self.oha(s, ["-n", "50", "-c", "1"], None, self.short_body(s))
                idle[s.label]["short"] = self.oha(s, ["-n", str(a.idle_requests), "-c", "1"], None, self.short_body(s))
                idle[s.label]["mix"] = self.oha(s, ["-n", str(a.idle_requests), "-c", "1"], self.bodies(s), None)

        overload: Optional[dict] = None
        if "overload" in phases and servers[0].label.startswith("attend"):
            rate = 2 * statistics.median(rates[servers[0].label])
            log(f"overload: twice attend's saturation ({rate:.1f}/s) from {a.overload_connections} connections, queue bound {a.overload_queue_tokens} tokens")
            overload = self.overload(servers[0], rate)
            log(f"  answered {overload['ok']}, other: {overload['other'] or 'none'}; p99 of the answered {overload['p99_answered_ms']:.1f} ms")

        if "rss" in phases:
            log("each server to its second RSS count")
            for s in servers:
                self.serve_until(s, s.rss_at[1])
                rss[s.label].append(s.rss_mib())
        self.only(None)
        for s in servers:
            s.signal(signal.SIGCONT)
        busy, total = (b - a for a, b in zip(machine0, machine_cpu()))
        ours = sum(s.cpu_s() for s in servers) - servers0 + self.oha_cpu_s + self.embed_cpu_s + self.overload_cpu_s
        ours += time.process_time() - self0
        other_share = max(0.0, busy - ours) / total if total else 0.0

        self.report(servers, phases, rates, short_rates, latency, idle, rss, overload, oha_cores, with_embed)
        self.record(servers, phases, rates, latency, idle, rss, overload, with_embed, other_share)
        print(f"CPU taken by other processes during the run: {100 * other_share:.0f} % of all CPUs (load average after: {os.getloadavg()[0]:.1f})")
        if other_share > 0.05:
            print("WARNING: the machine was not quiet; these timings are not trustworthy" + (" (memory figures are)" if "rss" in phases else ""))

    def drain_ms(self, attend_rates: List[float]) -> float:
        """Milliseconds to work off a full overload queue and one pass at attend's
        saturation rate: what a text admitted into a full queue waits at most."""
        tokens_per_s = statistics.median(attend_rates) * self.args.mean_tokens
        return 1e3 * (self.args.overload_queue_tokens + self.args.max_batch_tokens) / tokens_per_s

    # -- record ------------------------------------------------------------------

    def record(self, servers, phases, rates, latency, idle, rss, overload, with_embed, other_share) -> None:
        """The comparisons as records (scripts/bench/py/record.py), one per phase
        run: throughput (texts/s, higher is better), latency (ms), attend's memory
        after its second request count against its first (MiB), and the overload
        phase's p99 against the time to work off a full queue (ms)."""
        a = self.args
        if not servers[0].label.startswith("attend"):
            return
        attend, model = servers[0].label, Path(a.model).name
        versions = {"infinity": ("infinity-emb", a.infinity_version), "text-embeddings-inference": ("text-embeddings-inference", a.tei_version)}
        peers = dict(versions[s.label] for s in servers[1:])
        common = dict(threads=a.threads, peers={**peers, "oha": "1.16.0"}, other_load=other_share, args=a.record_args.split())
        if phases & {"throughput", "latency", "overload"}:
            mine = statistics.median(rates[attend])
            rows = [record.row("the mix, saturation", mine, s.label, statistics.median(rates[s.label]), "higher")
                    for s in servers[1:]]
            if with_embed:
                rows.append(record.row("the mix, saturation", mine, "attend embed --input",
                                       statistics.median(rates["attend embed"]), "higher"))
            if rows:
                record.write("serve", f"attend serve's throughput, {model}, f32", unit="texts/s", better="higher", rows=rows, **common)
        if "latency" in phases:
            # attend's own goal, peers or not: the p99 at half load against the idle
            # round trip (ratio = idle / p99; the goal p99 <= 3x idle is a ratio >= 1/3).
            own = latency[attend]["short"]
            rows = [record.row("short texts, p99 at 50 % load", own[50]["p99_ms"],
                               f"{attend}, one short text, idle, median", idle[attend]["short"]["p50_ms"],
                               rate_at_50=own[50]["rate"], p99_rounds_at_50_ms=own[50]["p99_rounds_ms"],
                               **{f"p{q}_at_{load}_ms": own[load][f"p{q}_ms"] for load in (25, 50, 75) for q in (50, 99)})]
            for s in servers[1:]:
                rows.append(record.row("one short text, idle, median", idle[attend]["short"]["p50_ms"], s.label, idle[s.label]["short"]["p50_ms"]))
                rows.append(record.row("the mix, idle, p99", idle[attend]["mix"]["p99_ms"], s.label, idle[s.label]["mix"]["p99_ms"]))
                for load in ("short", "mix"):
                    # 50 % of each side's own saturation on that load.
                    for q in ("p50", "p99"):
                        rows.append(record.row(f"{'short texts' if load == 'short' else 'the mix'}, {q} at 50 % load",
                                               latency[attend][load][50][f"{q}_ms"], s.label, latency[s.label][load][50][f"{q}_ms"]))
            record.write("serve", f"attend serve's latency, {model}, f32", unit="ms", better="lower", rows=rows, **common)
        if "rss" in phases:
            (small, _, _), (large, _, _) = rss[attend]
            counts = servers[0].rss_at
            rows = [record.row(f"resident memory after {counts[1]:,} requests of the mix", large,
                               f"the same server after {counts[0]:,}", small)]
            record.write("serve", f"attend serve's memory, {model}, f32", unit="MiB", better="lower", rows=rows, **common)
        if overload is not None:
            drain_ms = self.drain_ms(rates[attend])
            refused = sum(v for k, v in overload["other"].items() if k in ("429", "503"))
            failed = sum(v for k, v in overload["other"].items() if k not in ("429", "503"))
            rows = [record.row("twice the saturation: p99 of the answered", overload["p99_answered_ms"],
                               "time to work off a full queue and one pass", drain_ms,
                               answered=overload["ok"], refused=refused, failed=failed)]
            record.write("serve", f"attend serve overloaded, {model}, f32, --max-queue-tokens {a.overload_queue_tokens}",
                         unit="ms", better="lower", rows=rows, **common)

    # -- report ------------------------------------------------------------------

    def report(self, servers, phases, rates, short_rates, latency, idle, rss, overload, oha_cores, with_embed) -> None:
        a = self.args
        tokens = a.mean_tokens
        print(f"cpu: {a.cpu}")
        print(
            f"model: {a.model} (f32, {a.threads} threads on every side); {self.n_texts} texts "
            f"(seed {a.seed}), {tokens:.1f} tokens each on average ({a.token_range}); "
            "one text per request, POST /v1/embeddings, encoding_format float"
        )
        if oha_cores:
            print(f"load generator: oha -c {a.connections} over loopback; it used {oha_cores:.3f} cores on average during the saturation runs")
        for s in servers:
            print(f"server {s.label}: {' '.join(s.argv)}")
        attend = servers[0].label if servers[0].label.startswith("attend") else None
        if phases & {"throughput", "latency", "overload"}:
            print()
            print(f"throughput at saturation ({a.rounds} rounds of {a.seconds} s each, median; per round in brackets):")
            labels = [s.label for s in servers] + (["attend embed"] if with_embed else [])
            for label in labels:
                m = statistics.median(rates[label])
                runs = ", ".join(f"{x:.0f}" for x in rates[label])
                note = " (attend embed --input, start-up taken out)" if label == "attend embed" else ""
                print(f"  {label:<14} {m:8.1f} texts/s {m * tokens:10.0f} tokens/s  [{runs}]{note}")
        if "latency" in phases:
            print()
            print(f"latency at a constant request rate (a fraction of the side's own saturation on that load), ms, median of {a.rounds} rounds (each round's p99 in brackets):")
            for load, title in (("mix", "the mix"), ("short", f"one short text ({SHORT_TEXT!r}) a request")):
                print(f"  {title}:")
                for s in servers:
                    for pct, r in latency[s.label][load].items():
                        other = f"; non-200/errors: {r['other']}" if r["other"] else ""
                        rounds = ", ".join(f"{x:.1f}" for x in r["p99_rounds_ms"])
                        print(f"    {s.label:<14} {pct:3d} % ({r['rate']:7.1f}/s): p50 {r['p50_ms']:8.2f}  p99 {r['p99_ms']:8.2f} [{rounds}]{other}")
            print()
            print(f"idle server, one connection, {a.idle_requests} requests one after another, ms:")
            for s in servers:
                sh, mix = idle[s.label]["short"], idle[s.label]["mix"]
                print(f"  {s.label:<14} one short text: median {sh['p50_ms']:.2f}  p99 {sh['p99_ms']:.2f};  the mix: median {mix['p50_ms']:.2f}  p99 {mix['p99_ms']:.2f}")
        if overload is not None:
            drain_ms = self.drain_ms(rates[attend])
            refused = sum(v for k, v in overload["other"].items() if k in ("429", "503"))
            failed = {k: v for k, v in overload["other"].items() if k not in ("429", "503")}
            print()
            print(
                f"overload, {overload['rate']:.1f} requests/s (twice the saturation) from {a.overload_connections} connections "
                f"for {a.seconds} s, --max-queue-tokens {a.overload_queue_tokens}: {overload['ok']} answered, {refused} refused "
                f"(429/503), other failures: {failed or 'none'}; p99 of the answered {overload['p99_answered_ms']:.1f} ms, "
                f"against {drain_ms:.0f} ms to work off a full queue and one pass at the saturation rate"
            )
        if "rss" in phases:
            print()
            print("resident memory of the server process, MiB:")
            for s in servers:
                (small, _, _), (large, rest, n) = rss[s.label]
                helpers = f"; its {n} helper processes hold {rest:.1f} more" if n else ""
                print(f"  {s.label:<14} after {s.rss_at[0]} requests {small:8.1f}, after {s.rss_at[1]} {large:8.1f} (x{large / small:.3f}){helpers}")
        print()
        print("ratios (this run):")
        if attend and "throughput" in phases:
            for s in servers[1:]:
                per_round = [x / y for x, y in zip(rates[attend], rates[s.label])]
                print(f"  throughput {attend} / {s.label}: {statistics.median(per_round):.2f}x (per round: {', '.join(f'{x:.2f}' for x in per_round)}); goal >= 3x")
            if with_embed:
                per_round = [x / y for x, y in zip(rates[attend], rates["attend embed"])]
                print(f"  throughput {attend} / attend embed: {statistics.median(per_round):.2f}x (per round: {', '.join(f'{x:.2f}' for x in per_round)}); goal >= 0.9x")
        if attend and "latency" in phases:
            idle_ms = idle[attend]["short"]["p50_ms"]
            print(f"  {attend} idle round trip, one short text: {idle_ms:.2f} ms; goal <= 3 ms (MiniLM)")
            print(f"  {attend} p99 at 50 % load of short texts / idle round trip: {latency[attend]['short'][50]['p99_ms'] / idle_ms:.2f}x; goal <= 3x")
            print(
                f"  {attend} p99 at 50 % load of the mix / idle round trip: {latency[attend]['mix'][50]['p99_ms'] / idle_ms:.2f}x "
                f"(the mix's own p99 on an idle server is {idle[attend]['mix']['p99_ms'] / idle_ms:.2f}x: "
                f"under load {latency[attend]['mix'][50]['p99_ms'] / idle[attend]['mix']['p99_ms']:.2f}x that)"
            )
        if overload is not None:
            print(f"  {attend} at twice its saturation: p99 of the answered / time to work off a full queue: {overload['p99_answered_ms'] / drain_ms:.2f}x; goal: no failure but 429/503, p99 bounded by the queue")
        if attend and "rss" in phases:
            small, large = (m for m, _, _ in rss[attend])
            print(f"  {attend} RSS after {servers[0].rss_at[1]} / after {servers[0].rss_at[0]} requests: {large / small:.3f}; goal within 10 %")
        if "rss" in phases:
            for s in servers:
                if not s.label.startswith("attend"):
                    small, large = (m for m, _, _ in rss[s.label])
                    print(f"  {s.label} RSS after {s.rss_at[1]} / after {s.rss_at[0]} requests: {large / small:.3f}")


def median_run(runs: List[dict]) -> dict:
    """One latency level's rounds as one: the medians of their p50s and p99s, each
    round's p99 kept, and every round's non-200 answers and errors added up."""
    other: Dict[str, int] = {}
    for r in runs:
        for k, v in r["other"].items():
            other[k] = other.get(k, 0) + v
    return {
        "rate": runs[0]["rate"],
        "p50_ms": statistics.median(r["p50_ms"] for r in runs),
        "p99_ms": statistics.median(r["p99_ms"] for r in runs),
        "p99_rounds_ms": [r["p99_ms"] for r in runs],
        "other": other,
    }


def request_counts(text: str) -> List[int]:
    """``10000,100000`` -> ``[10000, 100000]``."""
    return [int(x) for x in text.split(",")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--model", required=True)
    p.add_argument("--attend", help="the attend binary (its `serve` command); none: infinity alone")
    p.add_argument("--infinity", help="infinity_emb from its own venv; none: attend alone")
    p.add_argument("--oha", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=48)
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    # Enough requests in flight for a server to form full batches.
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--latency-connections", type=int, default=128)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--idle-requests", type=int, default=1000)
    p.add_argument("--rss", type=request_counts, default=[10_000, 100_000], help="request counts of attend's two RSS readings")
    # infinity answers about 6x fewer requests a second: 100k of them would take hours.
    p.add_argument("--peer-rss", type=request_counts, default=[2_000, 10_000], help="the same for the other servers")
    p.add_argument(
        "--phases", type=lambda t: t.split(","), default=["throughput", "latency", "overload", "rss"],
        help="comma-separated, of throughput (saturation, attend embed), latency and overload (both measure "
        "at fractions or multiples of the saturation runs, which they run) and rss; default all four",
    )
    p.add_argument("--overload-connections", type=int, default=256)
    p.add_argument("--overload-queue-tokens", type=int, default=8192, help="attend's queue bound in the overload phase")
    p.add_argument("--max-batch-tokens", type=int, default=2048, help="attend serve's pass budget (its default)")
    p.add_argument("--oha-timeout", type=float, default=1800)
    p.add_argument("--start-timeout", type=float, default=300)
    p.add_argument("--cpu", required=True)
    p.add_argument("--infinity-version", help="infinity-emb's version, for the record")
    p.add_argument("--tei", help="text-embeddings-inference's text-embeddings-router binary; none: not measured")
    p.add_argument("--tei-version", help="its version, for the record")
    p.add_argument("--record-args", default="", help="scripts/bench/serve's own arguments, for the record")
    p.add_argument("--mean-tokens", type=float, required=True)
    p.add_argument("--token-range", required=True)
    args = p.parse_args()
    unknown = set(args.phases) - {"throughput", "latency", "overload", "rss"}
    if unknown:
        raise SystemExit(f"--phases: unknown {', '.join(sorted(unknown))} (throughput, latency, overload, rss)")
    for pair in (args.rss, args.peer_rss):
        if len(pair) != 2 or not 0 < pair[0] < pair[1]:
            raise SystemExit("--rss and --peer-rss take two request counts, the smaller first (e.g. 10000,100000)")

    threads = str(args.threads)
    servers: List[Server] = []
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", DO_NOT_TRACK="1",
               INFINITY_ANONYMOUS_USAGE_STATS="0", OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads,
               RAYON_NUM_THREADS=threads)
    if args.attend:
        argv = [args.attend, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", "0",
                "--precision", "f32", "--threads", threads, "--max-batch-tokens", str(args.max_batch_tokens)]
        servers.append(Server("attend serve", argv, env, args.work / "attend-serve.log", None, "/ready"))
    if args.infinity:
        port = free_port()
        argv = [args.infinity, "v2", "--model-id", args.model, "--engine", "torch", "--device", "cpu",
                "--dtype", "float32", "--no-vector-disk-cache", "--host", "127.0.0.1", "--port", str(port),
                "--url-prefix", "/v1"]
        # infinity answers /health outside its URL prefix, once its model is loaded and warmed up.
        servers.append(Server("infinity", argv, env, args.work / "infinity.log", port, "/health"))
    if args.tei:
        port = free_port()
        # TEI's CPU backend (candle) sizes its thread pool from RAYON_NUM_THREADS, set above.
        argv = [args.tei, "--model-id", args.model, "--dtype", "float32", "--hostname", "127.0.0.1",
                "--port", str(port), "--tokenization-workers", threads]
        servers.append(Server("text-embeddings-inference", argv, env, args.work / "tei.log", port, "/health"))
    if not servers:
        raise SystemExit("neither --attend, --infinity nor --tei: nothing to measure")

    bench = Bench(args, args.work)

    def stop_all(signum=None, frame=None):
        for s in servers:
            s.stop()
        if signum is not None:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop_all)
    try:
        for s in servers:
            s.start(args.start_timeout)
        bench.run(servers, with_embed=bool(args.attend))
    finally:
        stop_all()


if __name__ == "__main__":
    main()
