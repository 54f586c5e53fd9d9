"""The documentation stays true (issue 35): the README's example and every tutorial run, the site builds with
``mkdocs build --strict``, every committed figure is shown on a results page with a caption, and every command
quoted in the docs is either run here or listed in COMMANDS with the reason it is not.

Tutorials run at their ``# quick:`` sizes (docs/scripts/tutorials.py), each in a fresh interpreter, once: the
site is then built from those renders, so the build test adds only the build itself.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "scripts"))
import tutorials  # noqa: E402

TUTORIALS = sorted((DOCS / "tutorials").glob("*.md"))
PACKAGES = ["probes", "models", "cape", "analyses", "bench"]
ENV = {
    **os.environ,
    "PYTHONPATH": str(ROOT),
    "OMP_NUM_THREADS": "1",
    "NO_MKDOCS_2_WARNING": "1",
    "DISABLE_MKDOCS_2_WARNING": "true",
}


def pages() -> list[Path]:
    """README.md and every Markdown page written by hand under docs/ (not the figure gallery's symlink)."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


# The README's example --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_readme_example_runs_as_written():
    """The README's first Python block runs in a fresh interpreter and prints what its comments promise: the
    layer-2 attention within 0.05 TV of the BMA posterior, a one-to-one copyer assignment, the log-prob shape."""
    (code,) = tutorials.blocks(
        re.search(r"^## A first look\n(.*?)^## ", (ROOT / "README.md").read_text(), re.S | re.M)[1]
    )
    assert len(code.strip().splitlines()) <= 20, "the README's example must stay within 20 lines"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    tv, assignment, shape = done.stdout.strip().splitlines()[-3:]
    assert float(tv) < 0.05
    heads = json.loads(assignment.replace("(", "[").replace(")", "]"))[0]
    assert sorted(heads) == list(range(10))
    assert shape == "torch.Size([256, 6, 5])"


# Tutorials ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tutorials")


# What each tutorial's printed output must show, read back from its rendered page: (regex, check of the groups).
OUTPUTS = {
    "five_minutes": [
        (r"mean TV between attention and BMA: ([\d.]+)", lambda tv: float(tv) < 0.05),
        (r"beta=50.0: TV to BMA ([\d.e+-]+)", lambda tv: float(tv) < 1e-12),
    ],
    "your_gpt2": [
        (r"loss ([\d.]+) -> ([\d.]+) after", lambda a, b: float(b) < float(a)),
        (r"circuit: (\d+) of (\d+) edges", lambda kept, total: 0 < int(kept) <= int(total)),
    ],
    "paper_analyses": [(r"wrote \d+ files to .*: copyers\.png", lambda: True)],
    "nanogpt": [(r"target NLL ([\d.]+) nats", lambda nll: 0 < float(nll) < 1.7)],  # uniform guessing: log 5 = 1.61
}


def test_every_tutorial_has_output_checks():
    assert sorted(OUTPUTS) == sorted(p.stem for p in TUTORIALS)


@pytest.mark.slow
@pytest.mark.parametrize("page", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs_top_to_bottom(page, rendered):
    """Every block of the tutorial runs, in order, in one fresh interpreter; the rendered page keeps every block,
    shows each figure it made, and its printed output holds what the page says it shows."""
    tutorials.run(page, rendered, fast=True)
    text = (rendered / page.name).read_text()
    assert tutorials.blocks(text) == tutorials.blocks(page.read_text())
    pngs = sorted(rendered.glob(f"{page.stem}_*.png"))
    assert pngs, f"{page.name} shows no figure"
    for png in pngs:
        assert f"]({png.name})" in text
    for pattern, check in OUTPUTS[page.stem]:
        match = re.search(pattern, text)
        assert match and check(*match.groups()), f"{page.name}: no output matching {pattern!r} that passes its check"


def test_quick_sizes_are_smaller_than_the_pages():
    """A ``# quick:`` value replaces a number by a smaller one, so the suite runs the page itself, smaller."""
    found = 0
    for page in TUTORIALS:
        for code in tutorials.blocks(page.read_text()):
            for full, small in re.findall(r"=\s*(\S+)\s*#\s*quick:\s*(\S+)", code):
                found += 1
                assert 0 <= float(small) < float(full), f"{page.name}: quick {small} is not below {full}"
            assert "# quick:" not in tutorials.quick(code)
    assert found >= len(TUTORIALS)


# How-to guides whose Python blocks run as written (the rest show a skeleton to fill in: write_analysis.md).
HOWTO_RUN = ["load.md", "add_intervention.md"]


@pytest.mark.slow
def test_howto_python_blocks_run():
    for name in HOWTO_RUN:
        for code in tutorials.blocks((DOCS / "howto" / name).read_text()):
            done = subprocess.run(
                [sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, (name, done.stderr[-3000:])


def test_every_howto_python_block_runs_or_is_a_skeleton():
    for page in sorted((DOCS / "howto").glob("*.md")):
        code = "".join(tutorials.blocks(page.read_text()))
        assert page.name in HOWTO_RUN or not code or "    ..." in code, f"{page.name}: its Python is run by no test"


# The site --------------------------------------------------------------------------------------------------


def public_modules() -> list[str]:
    """Every module of the packages whose dotted name has no part starting with ``_`` (packages by name)."""
    names = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            if not any(p.startswith("_") for p in parts):
                names.append(".".join(parts))
    return sorted(names)


@pytest.mark.slow
def test_mkdocs_build_strict(rendered, tmp_path):
    """``mkdocs build --strict`` passes with no warning; the reference has a page with content for every public
    module; every tutorial page carries its figures."""
    try:
        import mkdocs  # noqa: F401
        import mkdocs_gen_files  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError as e:
        pytest.skip(f"mkdocs is not installed ({e.name}); it is in the dev extra: pip install -e '.[dev]'")
    for page in TUTORIALS:
        if not (rendered / page.name).exists():  # this test run alone: render the tutorials first
            tutorials.run(page, rendered, fast=True)
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        env={**ENV, "DOCS_TUTORIALS_RENDERED": str(rendered)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-5000:]
    assert not re.search(r"^WARNING\s+-", log, re.M), log[-5000:]
    for name in public_modules():
        html = (site / "reference" / "api" / name / "index.html").read_text()
        assert f'id="{name}' in html or "doc-module" in html, f"reference page of {name} is empty"
    for page in TUTORIALS:
        html = (site / "tutorials" / page.stem / "index.html").read_text()
        for png in rendered.glob(f"{page.stem}_*.png"):
            assert (site / "tutorials" / png.name).exists() and png.name in html


def test_every_committed_figure_is_on_a_results_page_with_a_caption():
    """Each PNG in figures/ is an image on a page of docs/results/, followed by a caption paragraph."""
    shown = {}
    for page in sorted((DOCS / "results").glob("*.md")):
        for name, after in re.findall(r"!\[[^\]]*\]\(\.\./figures/([^)\s]+\.png)\)\n\n([^\n!#|]+)", page.read_text()):
            shown[name] = after
    missing = sorted(p.name for p in (ROOT / "figures").glob("*.png") if p.name not in shown)
    assert not missing, f"figures not on a results page with a caption: {missing}"


# Commands --------------------------------------------------------------------------------------------------

LONG = "too long for CI at this size; the test named runs the same entry point smaller"
TEMPLATE = "a template: names a file or value the reader supplies"
# (pattern matching the whole command, why it is not run here, or the test that runs it). Every command quoted
# in README.md or docs/ (```bash lines, and inline code starting with python -m, bash, torchrun, pip, mkdocs
# or an environment variable) must match one row; a row that matches nothing is stale and fails.
COMMANDS = [
    (
        r"pip install torch==2\.13\.0 --extra-index-url \S+ --retries 0 && pip install -e \"\.\[dev\]\" -c constraints\.txt && python -m (analyses\.head_ablation|pytest)",
        "run by .ci/run in CI, in a fresh virtual environment (the README's first bash block)",
    ),
    (
        r"pip install torch==2\.13\.0|pip install -e \"\.\[dev\]\" -c constraints\.txt|pip install -e \"\.\[sweep\]\"",
        "the set-up's parts, run by .ci/run as above",
    ),
    (r"python -m venv \.venv && \. \.venv/bin/activate", "what .ci/run does before the set-up"),
    (r"(OMP_NUM_THREADS=1 )?python -m pytest( \S+)*|bash \.ci/run", "CI itself (the suite runs every test file)"),
    (r"python -m", "not a command: the words in a sentence about an analysis's `python -m` run"),
    (
        r"python -m venv tl2 && \. tl2/bin/activate && pip install \"transformer-lens<3\" auto-circuit",
        "a second environment beside TransformerLens 2.x for the peer tools; it cannot sit beside this suite's TransformerLens 4",
    ),
    (
        r"mkdocs (serve|build)",
        "test_mkdocs_build_strict builds the site (serve is the same build and a local web server)",
    ),
    (r"python -m [\w.]+ --help", "run here: test_help_commands_run"),
    (
        r"python -m analyses\.<name>|python -m analyses\.\w+ --checkpoint (X|RUN|FOLDER|out/ckpt\.pt|model\.pt|w\.pt --config task\.json|paper\.pt --key-map paper_map\.json|runs/(train|standard|mine))",
        TEMPLATE,
    ),
    (
        r"python -m analyses\.scale --from-runs LABEL=FOLDER|python -m models\.evaluate --checkpoint \.\.\.|python -m models\.train --preset small\|medium\|large",
        TEMPLATE,
    ),
    (
        r"python -m analyses\.\w+( --checkpoint (default|standard|theorem1:beta=50))?( --(method|corruption|search|threshold|direction) \S+)*( --full)?",
        "an analysis at full size (all of them: python -m analyses.paper, 470 s); tests/analyses/test_<analysis>.py runs each "
        "smaller, tests/analyses/test_every_family.py every one on a tiny GPT-2",
    ),
    (
        r"python -m analyses\.paper( --out /tmp/paper_run)?( --jobs 2)?|python -m analyses\.paper --only( \w+)+",
        "the paper run (470 s on 2 cores; --only runs some analyses); tests/analyses/test_paper.py runs its engine",
    ),
    (
        r"python -m (analyses\.paper|analyses\.phase_diagram --full) --cluster slurm:cpu --jobs \d+",
        "needs a Slurm cluster; tests/models/training/test_sweep.py runs the submitit path against a stand-in sbatch",
    ),
    (
        r"python -m analyses\.\w+ --checkpoint runs/\S+( --out runs/\S+| --n-contexts \d+| --train-steps 0| --threads \d+)*",
        "reads the run a training command beside it writes (" + LONG + ": tests/probes/test_task_family.py)",
    ),
    (
        r"python -m models\.(train|standard)( --\S+ \S+)* --out (runs|models/checkpoints)/\S+( --\S+( \S+)?)*|python -m models\.standard --task-kind .*",
        LONG
        + ": tests/models/training/test_checkpoint_and_train.py, tests/models/training/test_standard.py, tests/probes/test_task_family.py",
    ),
    (
        r"python -m models\.(train|standard)( --(lr|steps|init-demo|preset) \S+)*",
        LONG + ": tests/models/training/test_checkpoint_and_train.py, tests/models/training/test_standard.py",
    ),
    (
        r"python -m models\.evaluate( --checkpoint (models/checkpoints/default|runs/mine))?",
        "tests/models/training/test_checkpoint_and_train.py evaluates the shipped checkpoint on 4096 contexts",
    ),
    (
        r"torchrun --standalone --nproc_per_node 2 -m models\.train --out runs/ddp",
        LONG + ": tests/models/training/test_distributed.py",
    ),
    (
        r"python -m bench( --only (large|circuit|scale))?( --threads [12])?( --json \S+)?",
        "a benchmark of minutes, on a quiet machine; tests/robustness/test_entry_point_convention.py runs its flag checks",
    ),
    (r"python -m [\w.]+( --\S+ \S+)* --device cuda( --\S+ \S+)*", "needs a GPU"),
    (
        r"python -m analyses\.nichani_dags( --\S+ \S+)*",
        "trains one GPT-2 per DAG (" + LONG + ": tests/analyses/test_nichani_dags.py, which also re-plots with --sweep)",
    ),
    (
        r"KILL9_TRIALS=20 python -m pytest tests/(test_robustness_work|robustness/test_work_never_lost)\.py -k kill9 -s",
        "the suite runs 3 trials of it",
    ),
]


def quoted_commands() -> dict[str, str]:
    """Every command quoted in the docs, whitespace-normalised, with the first page that quotes it."""
    found = {}
    for page in pages():
        text = page.read_text()
        lines = [line for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M) for line in block.splitlines()]
        lines += re.findall(r"`((?:python -m|bash |torchrun|pip install|mkdocs |[A-Z0-9_]+=\S+ python)[^`]*)`", text)
        for line in lines:
            command = re.sub(r"\s+", " ", line.split("  #")[0].split(" # ")[0]).strip()
            if command:
                found.setdefault(command, str(page.relative_to(ROOT)))
    return found


def test_every_command_in_the_docs_is_run_or_listed():
    commands = quoted_commands()
    unlisted = [f"{c!r} ({page})" for c, page in commands.items() if not any(re.fullmatch(p, c) for p, _ in COMMANDS)]
    assert not unlisted, "commands neither run by a test nor listed in COMMANDS:\n" + "\n".join(unlisted)
    stale = [p for p, _ in COMMANDS if not any(re.fullmatch(p, c) for c in commands)]
    assert not stale, f"COMMANDS rows that match no command in the docs: {stale}"


def test_help_commands_run():
    """Every ``--help`` the docs quote prints its usage and exits 0 (the listed reason of that row)."""
    helps = sorted(c for c in quoted_commands() if re.fullmatch(r"python -m [\w.]+ --help", c))
    assert helps
    for command in helps:
        done = subprocess.run(
            [sys.executable, *command.split()[1:]], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0 and done.stdout.startswith("usage: "), (command, done.stderr[-2000:])
