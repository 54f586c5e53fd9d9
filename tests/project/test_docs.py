"""The documentation stays true (issue 35): the README's example and every tutorial run, the site builds with
``mkdocs build --strict``, every committed figure is shown on a results page with a caption, and every command
quoted in the docs is either run here or listed in COMMANDS with the reason it is not.

The tutorials' pages are committed renders (``docs/tutorials/rendered/``, written by
``python docs/scripts/tutorials.py``, issue 43): here each is checked current (its source unchanged since it was
rendered, and the render exactly its source plus outputs) and showing what its prose promises; the slow tier
also runs each tutorial at its ``# quick:`` sizes in a fresh interpreter. The site is built from the committed
renders and executes nothing.
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


# What each tutorial's printed output must show, read from its render: (regex, check of the groups).
OUTPUTS = {
    "five_minutes": [
        (r"mean TV between attention and BMA: ([\d.]+)", lambda tv: float(tv) < 0.05),
        (r"beta=50.0: TV to BMA ([\d.e+-]+)", lambda tv: float(tv) < 1e-12),
    ],
    "your_gpt2": [
        (r"loss ([\d.]+) -> ([\d.]+) after", lambda a, b: float(b) < float(a)),
        # at the quick sizes (20 steps) the model has no progress over the plateau: no circuit of nothing
        (r"circuit: (?:(\d+) of (\d+) edges|the model's progress over the uniform-parent plateau is .* not beyond 2)",
         lambda kept, total: kept is None or 0 < int(kept) <= int(total)),
    ],
    "paper_analyses": [(r"copyers: (\d+) distinct demonstrations for (\d+) heads", lambda n, k: 0 < int(n) <= int(k))],
    "nanogpt": [(r"target NLL ([\d.]+) nats", lambda nll: 0 < float(nll) < 1.7)],  # uniform guessing: log 5 = 1.61
}


def check_render(page: Path, folder: Path) -> None:
    """``folder``'s render of ``page`` keeps every block of it, shows each figure it made (and only those), and its
    printed output holds what the page says it shows."""
    text = (folder / page.name).read_text()
    assert tutorials.blocks(text) == tutorials.blocks(page.read_text())
    shown = [f for output in tutorials.outputs_of(text) for f in output.figures]
    assert shown, f"{page.name} shows no figure"
    assert sorted(shown) == sorted(p.name for p in folder.glob(f"{page.stem}_*.png")), "figures on disk != shown"
    for pattern, check in OUTPUTS[page.stem]:
        match = re.search(pattern, text)
        assert match and check(*match.groups()), f"{page.name}: no output matching {pattern!r} that passes its check"


def test_every_tutorial_has_output_checks():
    assert sorted(OUTPUTS) == sorted(p.stem for p in TUTORIALS)


@pytest.mark.parametrize("page", TUTORIALS, ids=lambda p: p.stem)
def test_committed_render_is_current_and_shows_its_outputs(page):
    """The committed render is the page as it is now plus its outputs (``tutorials.stale``: the source's hash in
    the render's first line, and the render rebuilt from the source and the render's own outputs equal to it), and
    those outputs hold what the page promises, the figures included."""
    why = tutorials.stale(page.name)
    assert why is None, f"docs/tutorials/rendered/{page.name}: {why}; run: python docs/scripts/tutorials.py {page.stem}"
    check_render(page, tutorials.RENDERED)
    run = dict(
        item.split("=", 1) for item in tutorials.HEADER.match((tutorials.RENDERED / page.name).read_text())[3].split()
    )
    assert run["quick"] == "0", "a committed render is of the page as written, not its quick sizes"


def test_rendered_folder_holds_only_renders_of_tutorials():
    names = {p.stem for p in TUTORIALS}
    for path in tutorials.RENDERED.iterdir():
        stem = path.stem.rsplit("_", 1)[0] if path.suffix == ".png" else path.stem
        assert stem in names and path.suffix in (".md", ".png"), f"{path.name}: not a render of a tutorial"


def test_stale_renders_are_told_apart(tmp_path, monkeypatch):
    """``stale`` (what the test above relies on) names a render whose source changed, one edited by hand, a missing
    figure and a missing render, and accepts a render made by ``compose`` (checked on a page made here)."""
    sources, renders = tmp_path / "src", tmp_path / "out"
    sources.mkdir(), renders.mkdir()
    monkeypatch.setattr(tutorials, "SOURCES", sources)
    source = "# T\n\nSee [x](../index.md) and [t](t.md).\n\n```python\nprint(1)\n```\n\nEnd.\n"
    (sources / "t.md").write_text(source)
    assert tutorials.stale("t.md", renders) == "not rendered"
    note = "name=t quick=0 date=2026-01-01 threads=1 cores=2 seconds=3 cpu=2 load=1.0-1.0"
    render = tutorials.compose(source, [tutorials.Output("1\n", ["t_1.png"])], note, "t.md")
    assert "](../../index.md)" in render and "](t.md)" in render and 'title="Output"\n1\n' in render
    (renders / "t.md").write_text(render)
    assert "figures missing" in tutorials.stale("t.md", renders)
    (renders / "t_1.png").write_bytes(b"")
    assert tutorials.stale("t.md", renders) is None
    (renders / "t.md").write_text(render.replace("End.", "The end."))
    assert "edited by hand" in tutorials.stale("t.md", renders)
    (renders / "t.md").write_text(render)
    (sources / "t.md").write_text(source.replace("print(1)", "print(2)"))
    assert tutorials.stale("t.md", renders) == "its source changed since it was rendered"


def test_render_never_replaces_its_source(tmp_path):
    """A render into the tutorials' own folder, or a quick render over the committed ones, is refused in one line
    (exit 2) and changes nothing (issue 41)."""
    before = {p: p.read_bytes() for p in (DOCS / "tutorials").rglob("*") if p.is_file()}
    script = str(DOCS / "scripts" / "tutorials.py")
    for flags in (["five_minutes", "--out", "docs/tutorials"], ["five_minutes", "--quick"], ["nothing_such"]):
        done = subprocess.run(
            [sys.executable, script, *flags], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, (flags, done.stderr)
        assert done.stderr.startswith("error: "), done.stderr
    with pytest.raises(ValueError, match="own folder"):
        tutorials.run(TUTORIALS[0], TUTORIALS[0].parent, fast=True)
    assert before == {p: p.read_bytes() for p in (DOCS / "tutorials").rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("page", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs_top_to_bottom(page, tmp_path):
    """Every block of the tutorial runs, in order, in one fresh interpreter at its ``# quick:`` sizes; the render
    keeps every block, shows each figure it made, and its output holds what the page says it shows."""
    tutorials.run(page, tmp_path, fast=True)
    check_render(page, tmp_path)
    assert tutorials.stale(page.name, tmp_path) is None


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


# How-to guides whose Python blocks run as written (the rest show a skeleton to fill in); FOLLOWED: the pages
# whose blocks tests/project/test_howtos.py writes into a copy of the repository and runs.
HOWTO_RUN = ["load.md", "add_intervention.md", "beside_your_project.md", "notebook.md"]
FOLLOWED = ["write_analysis.md", "add_format.md"]


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
        assert page.name in HOWTO_RUN + FOLLOWED or not code or "    ..." in code, f"{page.name}: its Python is run by no test"


# The public API whose reference pages must show each parameter with its type (issue 45): models.load and its
# kin, models.save, load_subject, the Subject's methods, the circuit's library call, and every function probes
# exports. The parameters are read from the signatures, independently of the docstrings.
MODELS_API = ["load", "load_task", "load_layout", "load_subject", "save"]


def documented() -> list[tuple[str, str, list[str]]]:
    """(module whose page shows it, qualified name, parameters) of each public call checked above."""
    import inspect

    import models
    import models.interp.circuit as circuit
    import probes

    calls = [getattr(models, n) for n in MODELS_API]
    calls += [getattr(models.Subject, n) for n in ("log_probs", "attention", "head_output", "pattern_hook")]
    calls += [getattr(circuit, "discover")] if hasattr(circuit, "discover") else []  # being written (issue 43)
    calls += [getattr(probes, n) for n in probes.__all__ if inspect.isfunction(getattr(probes, n))]
    calls += [probes.MarkovTreeTask.sample, probes.Layout.encode]
    found = []
    for call in calls:
        parameters = [p for p in inspect.signature(call).parameters if p not in ("self", "cls")]
        found.append((call.__module__, call.__qualname__, parameters))
    return found


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
def test_mkdocs_build_strict(tmp_path):
    """``mkdocs build --strict`` passes with no warning, from the committed renders (nothing executed); the
    reference has a page with content for every public module; every tutorial page carries its figures; the API
    pages of the public calls show their parameters with types."""
    try:
        import mkdocs  # noqa: F401
        import mkdocs_gen_files  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError as e:
        pytest.skip(f"mkdocs is not installed ({e.name}); it is in the dev extra: pip install -e '.[dev]'")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        env=ENV,
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
        html = (site / "tutorials" / "rendered" / page.stem / "index.html").read_text()
        for png in tutorials.RENDERED.glob(f"{page.stem}_*.png"):
            assert (site / "tutorials" / "rendered" / png.name).exists() and png.name in html
        assert '<span class="filename">Output</span>' in html, f"{page.name}: no output block titled Output"
    for module, name, parameters in documented():
        html = (site / "reference" / "api" / module / "index.html").read_text()
        at = html.index(f'id="{module}.{name}"')
        end = html.find('class="doc doc-heading"', html.index(">", at))  # the next object's heading
        section = html[at : end if end > 0 else None]
        for parameter in parameters:
            row = re.search(rf"<td>\s*<code>{parameter}</code>\s*</td>\s*<td>(.*?)</td>", section, re.S)
            assert row, f"{module}.{name}: parameter {parameter} has no row in its Parameters table"
            assert re.sub(r"<[^>]+>|\s", "", row[1]), f"{module}.{name}: parameter {parameter} shows no type"


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
    (
        r"pip install torch==2\.13\.0 --extra-index-url \S+ --retries 0 && pip install -e \. -c constraints\.txt",
        "the library-only install: the first bash block's without [dev] (CI installs [dev], which holds it; measured "
        "in a fresh venv for issue 50: 100 s, 1.7 GB)",
    ),
    (r"python -m venv \.venv && \. \.venv/bin/activate", "what .ci/run does before the set-up"),
    (
        r"git clone <repository URL> causal-icl-probes && cd causal-icl-probes",
        "a template: the repository's address; CI runs in a clone already",
    ),
    (
        r"cd causal-icl-probes && python -m analyses\.inspect --checkpoint /path/to/your/project/runs/mine",
        TEMPLATE
        + " (tests/analyses/test_inspect.py runs inspect; test_howto_python_blocks_run checks which models is imported)",
    ),
    (r"(OMP_NUM_THREADS=1 )?python -m pytest( \S+)*|bash \.ci/run", "CI itself (the suite runs every test file)"),
    (r"python -m", "not a command: the words in a sentence about an analysis's `python -m` run"),
    (
        r"python -m venv tl2 && \. tl2/bin/activate && pip install \"transformer-lens<3\" auto-circuit",
        "a second environment beside TransformerLens 2.x for the peer tools; it cannot sit beside this suite's TransformerLens 4",
    ),
    (
        r"mkdocs (serve|build)( --strict)?",
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
        r"python -m analyses\.paper( --out (/tmp/paper_run|DIR))?( --jobs 2)?|python -m analyses\.paper --only( \w+)+",
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
        r"python -m bench( --only (large|circuit|scale|circuit-scale|step))?( --threads [12])?( --json \S+)?",
        "a benchmark of minutes, on a quiet machine; tests/robustness/test_entry_point_convention.py runs its flag checks",
    ),
    (
        r"python -m analyses\.circuit --checkpoint standard( --n-contexts \d+ --n-held-out \d+ --curve-points \d+)? --threads 1",
        "the circuit at full size, timed (minutes); tests/analyses/test_circuit_cli.py runs it smaller",
    ),
    (
        r"python -m bench\.circuit_stages( --checkpoint \S+ --n-contexts \d+ --n-held-out \d+ --curve-points \d+)?",
        "the circuit's stages timed (minutes; on the GPT-2-small shape, more than 20); "
        "tests/models/interp/test_circuit_big_graph.py runs the same stages on a small stand-in",
    ),
    (
        r"python -m analyses\.circuit --checkpoint /tmp/gpt2_deep",
        "a GPT-2-small-shaped model's circuit (15 minutes, 13 GB); tests/models/interp/test_circuit_big_graph.py "
        "runs discover at the level of nodes on a small stand-in of that shape",
    ),
    (
        r"python -m (cProfile -m )?analyses\.circuit --checkpoint /tmp/gpt2_planted( --n-contexts \d+)?( --n-held-out \d+)?",
        "the planted GPT-2-small-shaped model's circuit (8 minutes; profiled at 22 contexts, 3); "
        "tests/models/interp/test_planted.py runs the default circuit on a 4-layer planted model",
    ),
    (
        r"python -m bench\.deepened /tmp/gpt2_planted --noise 1",
        "writes the planted GPT-2-small-shaped model (a 500 MB folder); tests/models/interp/test_planted.py plants "
        "the same way at 4 layers",
    ),
    (
        r"python -m bench\.planted \S+",
        "plants the shipped GPT-2 in six deeper models and scores their circuits (about 10 minutes); "
        "tests/models/interp/test_planted.py runs the same evaluation on one 4-layer planted model",
    ),
    (
        r"python -m bench\.attribution_memory",
        "peak memory of attribution at 128 and 512 contexts in fresh processes (a minute); "
        "tests/robustness/test_library_inputs.py::test_attribution_is_sized_before_any_work checks the count it sets",
    ),
    (
        r"python -m bench\.deepened \S+",
        "writes a GPT-2-small-shaped model (500 MB); tests/models/interp/test_circuit_big_graph.py checks deepen() "
        "on a small stand-in computes what the shipped model computes",
    ),
    (
        r"python -m cProfile -o \.\.\. -m analyses\.circuit \.\.\.",
        "a profile of an older commit, quoted for the record of how the stages were found",
    ),
    (
        r"python -m bench\.auto_circuit_compare export runs/ac && tl2/bin/python bench/auto_circuit_compare\.py compare runs/ac",
        "needs a second environment with TransformerLens 2.x and auto-circuit (the page says how)",
    ),
    (
        r"python -m bench\.auto_circuit_nodes export \S+ runs/acn && tl2/bin/python bench/auto_circuit_nodes\.py "
        r"compare \S+ runs/acn",
        "needs a second environment with TransformerLens 2.x and auto-circuit; tests/models/interp/test_planted.py "
        "checks the node attribution it compares against central differences",
    ),
    (r"python -m [\w.]+( --\S+ \S+)* --device cuda( --\S+ \S+)*", "needs a GPU"),
    (
        r"python -m analyses\.nichani_dags( \S+)*",
        "trains one CatFormer (or GPT-2) per DAG (" + LONG + ": tests/analyses/test_nichani_dags.py, which also re-plots "
        "with --sweep)",
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
