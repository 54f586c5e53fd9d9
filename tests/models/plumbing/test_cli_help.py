"""``--help`` of every entry point: every flag explained, and the fast path (``models.plumbing.fast_help``) prints
exactly what the entry point's own parser prints, without importing torch."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import analyses
from models.plumbing import fast_help

ROOT = Path(__file__).resolve().parents[3]
# module run by `python -m NAME` -> the module whose main(argv) parses its flags
ENTRY_POINTS = {
    **{
        f"analyses.{m.name}": f"analyses.{m.name}"
        for m in pkgutil.iter_modules(analyses.__path__)
        if m.name != "common"
    },
    "models.train": "models.training.train",
    "models.standard": "models.training.standard",
    "models.evaluate": "models.training.evaluate",
    "bench": "bench.__main__",
}


def parser_of(name: str) -> argparse.ArgumentParser:
    """The parser the entry point builds, caught at its ``parse_args`` before any work."""

    class Caught(Exception):
        pass

    def catch(self, *args, **kwargs):
        raise Caught(self)

    module = importlib.import_module(ENTRY_POINTS[name])
    run = getattr(module, "parse_args", module.main)  # main may catch every exception (run_cli)
    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = catch
    try:
        run([])
    except Caught as caught:
        return caught.args[0]
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError(f"{name} parsed no flags")


def live_help(name: str) -> str:
    """What ``python -m NAME --help`` prints through argparse, at the cached width."""
    with contextlib.redirect_stdout(io.StringIO()) as out:
        parser_of(name).print_help()
    return out.getvalue()


@pytest.fixture(scope="module")
def cached():
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(fast_help.COLUMNS)
    try:
        live = {name: live_help(name) for name in ENTRY_POINTS}
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    if os.environ.get("UPDATE_CLI_HELP"):
        fast_help.HELP_FILE.write_text(json.dumps(live, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return json.loads(fast_help.HELP_FILE.read_text(encoding="utf-8")), live


def test_every_flag_is_explained_in_words():
    for name in ENTRY_POINTS:
        for action in parser_of(name)._actions:
            words = (action.help or "").split("(default")[0].split()
            assert len(words) >= 3, f"{name} {action.option_strings}: help {action.help!r} explains nothing"


def test_the_cached_help_is_what_each_parser_prints(cached):
    texts, live = cached
    assert sorted(texts) == sorted(live), (
        "entry points added or removed: UPDATE_CLI_HELP=1 python -m pytest tests/models/plumbing/test_cli_help.py"
    )
    for name, text in live.items():
        assert texts[name] == text, f"{name}: stale help; UPDATE_CLI_HELP=1 python -m pytest tests/models/plumbing/test_cli_help.py"


@pytest.mark.parametrize("name", ["analyses.head_ablation", "models.train", "bench"])
def test_help_answers_before_torch_is_imported(name, cached):
    texts, _ = cached
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", name, "--help"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-500:]
    assert run.stdout == texts[name]
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" not in imported and "transformer_lens" not in imported


def test_help_asked_reads_only_the_python_m_form(monkeypatch):
    for argv, expected in [
        (["python", "-m", "analyses.copyers", "--help"], "analyses.copyers"),
        (["python", "-X", "importtime", "-m", "bench", "--seed", "1", "-h"], "bench"),
        (["python", "-m", "models.train", "--out", "x"], None),
        (["python", "script.py", "--help"], None),
        (["python", "-m"], None),
    ]:
        monkeypatch.setattr(sys, "orig_argv", argv)
        assert fast_help.help_asked() == expected
