"""``--help`` of every entry point: every flag explained; ``python -m NAME --help`` prints exactly what the entry
point's own parser prints (no cached text), and a mistyped flag gets the parser's own one-line refusal, both
before torch is imported, because every entry point parses its flags before its heavy imports."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "docs" / "scripts"))
from entry_points import COLUMNS, CONFIGS, PAGE, configs_page, entry_points, help_text, page, parser_of  # noqa: E402

ENTRY_POINTS = entry_points()
# Entry points whose flags are still declared in a module that imports torch (their --help is right, and slow):
# the trainers (their configs and parsers live beside the training code), cape_downstream (its defaults are
# cape.downstream's), inspect_standard (inspect's analysis, re-registered).
HEAVY = {
    "models.train",
    "models.standard",
    "models.evaluate",
    "analyses.cape_downstream",
    "analyses.inspect_standard",
}
LIGHT = [name for name in ENTRY_POINTS if name not in HEAVY]


def run(name: str, *argv: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``python -X importtime -m NAME argv...`` in a fresh interpreter, and the modules it imported."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(COLUMNS)}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", name, *argv], cwd=ROOT, env=env, capture_output=True, text=True
    )
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    proc.stderr = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("import time:"))
    return proc, imported


def test_the_reference_page_is_what_each_parser_prints():
    assert PAGE.read_text() == page(), f"stale {PAGE.name}: python docs/scripts/entry_points.py rewrites it"


def test_the_analyses_reference_page_is_every_config_field():
    """docs/reference/analyses.md is what the configs say, and names every field of every analysis's config."""
    import dataclasses

    from analyses import common

    assert CONFIGS.read_text() == configs_page(), f"stale {CONFIGS.name}: python docs/scripts/entry_points.py rewrites it"
    for name, analysis in common.registry().items():
        section = CONFIGS.read_text().split(f"## `{name}`\n", 1)[1].split("\n## ", 1)[0]
        assert all(f"| `{f.name}` |" in section for f in dataclasses.fields(analysis.config)), name


def test_every_flag_is_explained_in_words():
    for name in ENTRY_POINTS:
        for action in parser_of(name)._actions:
            words = (action.help or "").split("(default")[0].split()
            assert len(words) >= 3, f"{name} {action.option_strings}: help {action.help!r} explains nothing"


@pytest.mark.parametrize("name", LIGHT)
def test_help_is_the_parsers_own_and_answers_before_torch_is_imported(name):
    proc, imported = run(name, "--help")
    assert proc.returncode == 0, proc.stderr[-500:]
    assert proc.stdout == help_text(name)
    assert "torch" not in imported and "transformer_lens" not in imported and "numpy" not in imported


@pytest.mark.parametrize(
    "name, argv",
    [
        ("analyses.copyers", ["--n-context", "8", "--seeed", "1"]),  # --n-context: an abbreviation; --seeed: not
        ("analyses.head_ablation", ["--checkpoint", "default", "--n-contexts", "many"]),
        ("analyses.phase_diagram", ["--quick", "--full"]),
        ("analyses.paper", ["--jobz", "2"]),
        ("bench", ["--jsn", "b.json"]),
    ],
)
def test_a_mistyped_flag_is_refused_before_torch_is_imported(name, argv, capsys):
    """The same one line as the entry point's own parser gives, with no heavy import."""
    start = time.perf_counter()
    proc, imported = run(name, *argv)
    seconds = time.perf_counter() - start
    with capsys.disabled():
        print(f"\n{name} {' '.join(argv)}: refused in {seconds:.2f} s")  # measured, not asserted: machines differ
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "torch" not in imported and "transformer_lens" not in imported
    with pytest.raises(SystemExit) as parsed:  # the entry point's parser itself, in this process
        parser_of(name).parse_args(argv)
    assert parsed.value.code == 2
    assert proc.stderr.splitlines() == capsys.readouterr().err.splitlines()


def test_a_malformed_thread_variable_is_refused_before_torch_loads():
    """libgomp would print its own lines when torch loads with ``OMP_NUM_THREADS=abc``: the entry point refuses
    first, in one line, and never imports torch."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "abc"}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "analyses.copyers"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2 and "torch" not in imported
    assert errors == [
        "python -m analyses.copyers: error: environment variable OMP_NUM_THREADS='abc' is not a positive integer; "
        "unset it (--threads sets torch's threads)"
    ]
