"""Every figure reads at a glance: no text leaves the canvas, overlaps another text or lies over another
panel (``tests/helpers/layout_check.py``). The figures named in issue 34 are drawn by their analysis's own
``figures``: from measurements made here on small models (a GPT-2 with 8 heads reading 49 positions, a
Theorem-1 construction), and from the numbers in ``figures/*.json`` (what ``analyses.paper`` measured on
the shipped models, cheap to redraw; cape_downstream and phase_diagram train their own models, so only
these), the inspect figures also for eight heads of the shipped numbers; the checker is shown to find each
kind of problem."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import matplotlib
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from conftest import build_task  # noqa: E402
from layout_check import legends_over_data, small_text, text_problems, title_gap  # noqa: E402

import models  # noqa: E402
from analyses import common  # noqa: E402
from models.interp.subject import DisentangledSubject, load_subject  # noqa: E402

FIGURES = Path(common.FIGURES_DIR)
REDRAWN = ["circuit", "inspect", "inspect_standard", "copyers", "standard_circuit", "cape_downstream",
           "phase_diagram", "bma_agreement", "nichani_dags"]  # fmt: skip


def draw(name: str, results: dict, command: str | None, checkpoint: str | None) -> dict:
    """The analysis's figures of ``results``, with the flags of the command that measured them."""
    module = importlib.import_module(f"analyses.{name}")
    record = {"command": command, "checkpoint": checkpoint, "results": results}
    return module.ANALYSIS.load(record).figures()


@pytest.mark.parametrize("name", REDRAWN)
def test_no_text_is_clipped_overlapped_or_over_another_panel(name):
    record = json.loads((FIGURES / f"{name}.json").read_text())
    for stem, fig in draw(name, record["results"], record["command"], record["checkpoint"]).items():
        try:
            assert text_problems(fig) == [], stem
        finally:
            plt.close(fig)


@pytest.fixture(scope="module")
def small_subjects(tmp_path_factory) -> dict:
    """``gpt2``: an untrained GPT-2 with 8 heads reading 49 positions (6 demonstrations and the target, 7
    tokens each), weights wide enough (std 0.3) that its heads differ; ``theorem1``: the construction on a
    d = 3 task with 3 demonstrations of 5 tokens (content-free copyers: what copyers, head_ablation and
    bma_agreement read)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    task = build_task(d_vocab=5, n_examples=6, seq_len=7)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=5, n_positions=49, n_embd=16, n_layer=2, n_head=8, n_inner=32, initializer_range=0.3,
                     bos_token_id=0, eos_token_id=0)  # fmt: skip
    folder = tmp_path_factory.mktemp("gpt2_h8_p49")
    GPT2LMHeadModel(cfg).save_pretrained(folder)
    (folder / "task.json").write_text(json.dumps(task.to_dict()))
    small = build_task(d_vocab=3, n_examples=3, seq_len=5)
    theorem1 = DisentangledSubject(models.theorem1_model(small.pi, 3, 5, beta=50.0), small, "theorem1 (small)", "0")
    return {"gpt2": load_subject(folder), "theorem1": theorem1}


MEASURED = {  # analysis -> the small subject it runs on, and a config small enough for a test
    "inspect": ("gpt2", {"n_contexts": 16}),
    "inspect_standard": ("gpt2", {"n_contexts": 16}),
    "standard_circuit": ("gpt2", {"n_contexts": 16}),
    "circuit": ("gpt2", {"n_contexts": 8, "n_held_out": 16, "curve_points": 3, "corruptions": ("demonstrations",)}),
    "copyers": ("theorem1", {}),
    "head_ablation": ("theorem1", {"n_contexts": 16}),
    "bma_agreement": ("theorem1", {"n_contexts": 16, "train_lengths": (), "bma_lengths": (1, 4)}),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", MEASURED)
def test_figures_measured_on_a_small_model_keep_every_text_on_the_canvas_and_apart(name, small_subjects, tmp_path):
    """The analysis measured here (its ``run``, as ``python -m analyses.NAME`` runs it), then drawn."""
    which, given = MEASURED[name]
    module = importlib.import_module(f"analyses.{name}")
    with common.single_thread():
        result = module.run(small_subjects[which], module.Config(**given))
    for stem, fig in result.figures().items():
        try:
            assert text_problems(fig) == [], stem
        finally:
            plt.close(fig)


def test_inspect_figures_of_an_eight_head_model_keep_their_labels_apart():
    """Eight heads, the width at which the y labels of the middle and right panels fell on the panel to their
    left: the shipped standard model's numbers cut to layer 0's eight heads."""
    record = json.loads((FIGURES / "inspect_standard.json").read_text())
    r = dict(record["results"])
    r["heads"] = r["heads"][:8]
    for stem, fig in draw("inspect", r, None, "eight-heads").items():
        try:
            assert text_problems(fig) == [], stem
        finally:
            plt.close(fig)


def test_the_checker_finds_overlap_clipping_and_a_label_over_another_panel():
    fig, (a, b) = plt.subplots(1, 2, figsize=(4, 2))
    a.text(0.5, 0.5, "one label", transform=a.transAxes)
    a.text(0.52, 0.5, "another label", transform=a.transAxes)
    fig.text(0.98, 0.5, "off the edge of the canvas")
    b.set_ylabel("a y label long enough to fall on the left panel", labelpad=90)
    problems = text_problems(fig)
    plt.close(fig)
    assert any("'one label' overlaps 'another label'" in p for p in problems)
    assert any("'off the edge of the canvas' leaves the canvas" in p for p in problems)
    assert any("'a y label long enough" in p and "another panel" in p for p in problems)


def test_parallel_rotated_labels_apart_are_not_an_overlap():
    fig, ax = plt.subplots(figsize=(6, 3), layout="constrained")
    ax.set_xticks(range(6), [f"a long tick label {i}" for i in range(6)], rotation=35, ha="right")
    assert text_problems(fig) == []
    ax.set_xticks(range(6), [f"a long tick label {i}" for i in range(6)], rotation=35, ha="right", fontsize=30)
    assert any("overlaps" in p for p in text_problems(fig))
    plt.close(fig)


# The figures issue 45 looked at: what each defect was, and a check that sees it ------------------------


def _shipped_block_structure():
    """block_structure's first figure of the shipped checkpoint (|W_KQ| and its block norms; no training)."""
    from analyses import block_structure

    subject = models.load_subject("default")
    res = block_structure.block_structure(subject.model)
    res["w_kq_abs"] = subject.model.W_KQ.detach().abs().cpu().double()
    common.style()
    return {"block_structure": block_structure._plot_structure(res, subject.name)}


def _mended() -> dict:
    """The mended figures drawn from the shipped models' numbers, by file stem."""
    figs = {}
    for name in ("head_ablation", "inspect", "inspect_standard"):
        record = json.loads((FIGURES / f"{name}.json").read_text())
        figs.update(draw(name, record["results"], record["command"], record["checkpoint"]))
    figs.update(_shipped_block_structure())
    return figs


def test_the_mended_figures_have_no_small_text_no_legend_over_data_and_no_band_under_the_title():
    """block_structure's cell labels were 5 pt under an empty band; head_ablation_cumulative's legend lay over
    the zero-ablation drop (a log axis down to 1e-8)."""
    for stem, fig in _mended().items():
        try:
            assert small_text(fig) == [], stem
            assert legends_over_data(fig) == [], stem
            assert title_gap(fig) < 0.05, stem
            assert text_problems(fig) == [], stem
        finally:
            plt.close(fig)


def test_the_checks_see_small_text_a_legend_over_data_and_a_band_under_the_title():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1, 2], [0, 1, 2], label="a line")
    ax.legend(loc="center")
    ax.text(0, 2, "tiny", fontsize=5)
    fig.suptitle("a title")
    fig.subplots_adjust(top=0.6)
    assert small_text(fig) == ["'tiny' is 5 pt"]
    assert legends_over_data(fig) == ["a legend covers 'a line'"]
    assert title_gap(fig) > 0.2
    plt.close(fig)


def test_the_copy_map_is_drawn_on_its_meaning_0_to_1():
    """inspect_copy on the standard GPT-2 topped its scale at 0.08, so that no copying showed bright."""
    record = json.loads((FIGURES / "inspect_standard.json").read_text())
    fig = draw("inspect", record["results"], None, "standard")["inspect_copy"]
    (image,) = fig.axes[0].get_images()
    assert image.get_clim() == (0, 1) and max(max(h["copy_mass"]) for h in record["results"]["heads"]) < 0.2
    plt.close(fig)


@pytest.mark.slow
def test_activation_patching_heatmaps_of_a_kind_share_one_colour_scale(small_subjects, tmp_path):
    """Nine panels with nine colour scales made +-0.0015 of noise look like the structure beside it: now the
    heatmaps at one position share one scale, and those at all positions another."""
    from matplotlib.colors import Normalize

    from analyses import activation_patching

    with common.single_thread():
        r = activation_patching.run(small_subjects["theorem1"], activation_patching.Config(n_contexts=16))
    for stem, fig in r.figures().items():
        images = [im for ax in fig.axes for im in ax.get_images()]
        by_width = {}
        for im in images:  # a map at one position is H wide; a map at all positions, one column
            by_width.setdefault(im.get_array().shape[1] == 1, set()).add(im.get_clim())
        assert len(images) == 4 * (2 if stem.endswith("qk") else 1) and all(len(c) == 1 for c in by_width.values()), stem
        assert all(isinstance(im.norm, Normalize) for im in images)
        plt.close(fig)


@pytest.mark.slow
def test_no_identifier_wraps_mid_word_on_the_analyses_results_page_at_1280_px(tmp_path):
    """docs/results/analyses.md built alone with the site's theme and laid out by a headless Chromium 1280
    px wide: no code span without a space is drawn on two lines (the table's first column squeezed
    ``standard_vs_disentangled`` into three)."""
    import shutil
    import subprocess
    import sys

    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        pytest.skip("no Chromium to lay the page out")
    root = FIGURES.parent
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "index.md").write_text("# t\n")
    shutil.copy(root / "docs" / "results" / "analyses.md", tmp_path / "docs" / "results" / "analyses.md")
    shutil.copytree(root / "docs" / "stylesheets", tmp_path / "docs" / "stylesheets")  # the site's own CSS too
    (tmp_path / "mkdocs.yml").write_text("site_name: t\ntheme:\n  name: material\nmarkdown_extensions: [tables]\n"
                                         "extra_css: [stylesheets/extra.css]\n")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q"], cwd=tmp_path, check=True, capture_output=True)
    page = tmp_path / "site" / "results" / "analyses" / "index.html"
    script = """<script>window.addEventListener('load', () => { const broken = [];
      for (const el of document.querySelectorAll('.md-typeset code'))
        if (el.getClientRects().length > 1 && !/\\s/.test(el.textContent)) broken.push(el.textContent);
      const out = document.createElement('pre'); out.id = 'midword'; out.textContent = JSON.stringify(broken);
      document.body.appendChild(out); });</script>"""
    page.write_text(page.read_text().replace("</body>", script + "</body>"))
    dom = subprocess.run(
        [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,2000",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=300,
    ).stdout  # fmt: skip
    found = dom.split('<pre id="midword">')[1].split("</pre>")[0]
    assert json.loads(found.replace("&quot;", '"')) == []
