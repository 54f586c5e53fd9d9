"""Every figure reads at a glance: no text leaves the canvas, overlaps another text or lies over another
panel (``tests/layout_check.py``). The figures named in issue 34 are drawn by their analysis's own
``figures`` from the numbers in ``figures/*.json`` (what ``analyses.paper`` measured on the shipped models;
only the layout is tested here, so no analysis is rerun), the inspect figures also for eight heads, and
the checker is shown to find each kind of problem."""

from __future__ import annotations

import importlib
import json
import shlex
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from layout_check import text_problems  # noqa: E402

from analyses import common  # noqa: E402

FIGURES = Path(common.FIGURES_DIR)
REDRAWN = ["circuit", "inspect", "inspect_standard", "copyers", "standard_circuit", "cape_downstream",
           "phase_diagram", "bma_agreement"]  # fmt: skip


def draw(name: str, results: dict, command: str | None, checkpoint: str | None) -> dict:
    """The analysis's figures of ``results``, with the flags of the command that measured them."""
    module = importlib.import_module(f"analyses.{name}")
    args = common.parser_for(module.ANALYSIS).parse_args(shlex.split(command)[3:] if command else [])
    args.subject_name = checkpoint
    common.style()
    figs = module.ANALYSIS.figures(results, args)
    return figs if isinstance(figs, dict) else {name: figs}


@pytest.mark.parametrize("name", REDRAWN)
def test_no_text_is_clipped_overlapped_or_over_another_panel(name):
    record = json.loads((FIGURES / f"{name}.json").read_text())
    for stem, fig in draw(name, record["results"], record["command"], record["checkpoint"]).items():
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
