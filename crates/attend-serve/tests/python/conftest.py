"""Fixtures for the server's tests: the real model, the `attend` binary, and a
server started on a free loopback port and stopped after the test.

The server is the release build `cargo test --release` leaves in target/release
(scripts/test runs the Rust tests first); ATTEND_BIN names another.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

REPO = Path(__file__).resolve().parents[4]
LISTENING = re.compile(r"listening on http://(\S+)")


def _binary() -> Path:
    path = Path(os.environ.get("ATTEND_BIN", REPO / "target" / "release" / "attend"))
    if not path.is_file():
        pytest.fail(f"{path} not found: build it with `cargo build --release -p attend-cli`", pytrace=False)
    return path


@pytest.fixture(scope="session")
def model_dir() -> Path:
    env = os.environ.get("ATTEND_MODEL_DIR")
    if env:
        return Path(env)
    run = subprocess.run([str(REPO / "scripts" / "fetch-model")], capture_output=True, text=True, check=True)
    return Path(run.stdout.strip().splitlines()[-1])


class Server:
    """`attend serve` on a free loopback port; `url` once it accepts requests."""

    def __init__(self, model_dir: Path, *flags: str, env: dict | None = None):
        self.args = [str(_binary()), "serve", "--model", str(model_dir), "--port", "0", "--threads", "2", *flags]
        self.proc = subprocess.Popen(
            self.args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        found = threading.Event()
        self.address = None

        def read():
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                m = LISTENING.search(line)
                if m and not found.is_set():
                    self.address = m.group(1)
                    found.set()
            found.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not found.wait(60) or self.address is None:
            self.proc.kill()
            raise RuntimeError("attend serve did not start: " + " | ".join(self.lines))

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit status (killed, and the test failed, past `timeout`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"attend serve did not stop within {timeout} s after SIGTERM")
        finally:
            self.reader.join(5)


@pytest.fixture
def serve(model_dir):
    """Starts servers with the given flags; stops each at the end of the test."""
    started: list[Server] = []

    def start(*flags: str, model: Path | None = None, env: dict | None = None) -> Server:
        s = Server(model or model_dir, *flags, env=env)
        started.append(s)
        return s

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.stop()


@pytest.fixture(scope="module")
def shared(model_dir):
    """One server with the default flags for the tests that only send requests."""
    s = Server(model_dir)
    yield s
    assert s.stop() == 0, "\n".join(s.lines)


def pytest_configure(config):
    sys.path.insert(0, str(Path(__file__).parent))
