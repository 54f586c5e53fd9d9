"""analyses.circuit, the command line over ``models.interp.circuit.discover``: a model with no progress gets
one line and no circuit (exit 0), a held-out sample too large for memory is refused before any work (issue
41); the summary says how the held-out size was set and prints a share only beside a denominator beyond 2 SE
(issue 45); the circuit graph draws no edge through another node's label and marks where q, k, v arrive."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import build_task
from constructed import transposed_subject

from analyses import circuit, common
from models.interp.circuit import CircuitConfig, discover, report


@pytest.mark.slow  # 20 s at load 12 on 2 cores (the figures' set written)
def test_a_model_without_progress_is_told_in_one_line_with_no_circuit_and_exit_0(tmp_path, capsys):
    """theorem1:beta=1e-9 (progress -0.001 +- 0.001 in issue 41): the run ends normally, the JSON records the
    reason and no circuit, the summary says so in one line after its header, and both figures are drawn."""
    r = circuit.main(["--checkpoint", "theorem1:beta=1e-9", "--n-contexts", "64", "--out", str(tmp_path)]).data
    saved = json.loads((tmp_path / "circuit.json").read_text())["results"]
    assert saved["refused"] == r["refused"] and saved["edges"] == [] and saved["nodes"] == []
    out = capsys.readouterr().out.splitlines()
    assert out[1] == f"no circuit: {r['refused']}" and not any("faithfulness" in line for line in out)
    assert (tmp_path / "circuit_graph.png").exists() and (tmp_path / "circuit_curve.pdf").exists()


def test_a_held_out_sample_too_large_for_memory_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """``--n-held-out 1e8`` failed in the allocator after the whole search (issue 41). Now: exit 2, one line
    naming the flag and the memory it would need, before a single context is sampled. At the level of edges,
    whose answers hold the senders' writes on every held-out context (at the level of nodes they stream)."""
    from models.interp.circuit import discovery

    def no_work(*a, **k):
        raise AssertionError("the search started before the sizes were checked")

    monkeypatch.setattr(discovery, "per_context_baselines", no_work)
    argv = ["--checkpoint", "theorem1:beta=5", "--n-contexts", "8", "--level", "edges", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as e:
        common.run_cli(circuit.main, [*argv, "--n-held-out", "9000000"])  # 1e8 is beyond the flag's range
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--n-held-out 9000000" in err[0] and "would need about" in err[0], err
    assert not (tmp_path / "out" / "circuit.json").exists()


@pytest.fixture(scope="module")
def small_result() -> dict:
    subject = transposed_subject(build_task(n_examples=3, seq_len=4, alpha=0.3))
    return discover(subject, CircuitConfig(n_contexts=16, n_held_out=64, curve_points=2)).to_dict()


def test_the_summary_says_the_held_out_size_was_fixed_and_prints_shares_only_beside_real_denominators(small_result):
    """With --n-held-out, not "sized for progress SE 0.01" (issue 45); without, it is. A held-out or
    replicate progress within 2 SE of zero gets "no share" instead of the faithfulness and sufficiency
    shares of it."""
    text = circuit.summary(small_result)
    assert "answers on 64 held-out contexts (fixed by --n-held-out;" in text and "sized for progress SE" not in text
    assert "its edges alone keep" in text and "its nodes alone keep" in text
    chosen = {**small_result, "n_held_out_fixed": False}
    assert "(sized for progress SE 0.01 from the spread of the first 512;" in circuit.summary(chosen)
    none = copy.deepcopy(small_result)
    for where in ("held_out", "replicate"):
        none[where].update(progress=0.004, progress_se=0.003)
    text = circuit.summary(none)
    assert "its edges alone keep" not in text and "its nodes alone keep" not in text
    assert text.count("no share: the model's progress on these contexts is 0.004 +- 0.003") == 2


def _node_label_boxes(fig, ax, nodes: set) -> dict:
    """Each node label's extent on the canvas (display pixels), by its text."""
    renderer = fig.canvas.get_renderer()
    return {t.get_text(): t.get_window_extent(renderer) for t in ax.texts if t.get_text() in nodes}


def _edge_paths(ax) -> list:
    """Every arrow's curve (and head) on the canvas, as points ``[n, 2]`` in display pixels, curves flattened."""
    import numpy as np
    from matplotlib.patches import FancyArrowPatch

    arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
    arrows += [a.arrow_patch for a in ax.texts if getattr(a, "arrow_patch", None) is not None]
    return [np.concatenate(a.get_path().to_polygons(a.get_transform(), closed_only=False)) for a in arrows]


def _nearest(point, boxes: dict) -> str:
    return min(
        boxes,
        key=lambda n: (boxes[n].x0 + boxes[n].x1 - 2 * point[0]) ** 2 + (boxes[n].y0 + boxes[n].y1 - 2 * point[1]) ** 2,
    )


def test_the_circuit_graph_draws_no_edge_through_another_nodes_label_and_marks_q_k_v():
    """The committed figures/circuit.json, drawn as analyses.paper draws it: no edge passes through the label
    of a node other than its own two (issue 45: edges ran through L1H2's and others'); under every head with
    a kept q, k or v edge, that input's letter, in its colour, and the legend says so."""
    import matplotlib.pyplot as plt

    record = json.loads((common.FIGURES_DIR / "circuit.json").read_text())
    figs = circuit.ANALYSIS.load(record).figures()
    fig = figs["circuit_graph"]
    try:
        ax = fig.axes[0]
        fig.canvas.draw()
        r = record["results"]
        nodes = set(r["nodes"]) | {"embed", "pos_embed", "output"}
        boxes = _node_label_boxes(fig, ax, nodes)
        paths = _edge_paths(ax)
        assert len(paths) == len(r["edges"]) and len(boxes) >= len(r["nodes"])
        crossings = 0
        for pts in paths:
            own = {_nearest(pts[0], boxes), _nearest(pts[-1], boxes)}  # its sender and receiver
            for box in (b for n, b in boxes.items() if n not in own):
                crossings += bool(((pts[:, 0] > box.x0) & (pts[:, 0] < box.x1) & (pts[:, 1] > box.y0)
                                   & (pts[:, 1] < box.y1)).any())  # fmt: skip
        assert crossings == 0, f"{crossings} edges pass through a node's label"
        letters = [t for t in ax.texts if t.get_text() in ("q", "k", "v")]
        into = {(e["receiver"], e["input"]) for e in r["edges"] if e["input"] in ("q", "k", "v")}
        assert len(letters) == len(into)
        assert {t.get_text(): t.get_color() for t in letters} == {k: report.COLOURS[k] for _, k in into}
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
        assert "into a head's query (at its q)" in labels
    finally:
        for f in figs.values():
            plt.close(f)


def test_a_circuit_of_nodes_says_so_and_draws_no_curve(tmp_path, capsys):
    """--level nodes (what auto chooses on a GPT-2-small-sized model): the summary says the circuit is every
    edge among its nodes and why, scores are named as EAP's, a node measured only by attribution is marked
    so, the JSON records the level, and the curve figure says why there is none."""
    r = circuit.main(["--checkpoint", "standard", "--level", "nodes", "--n-contexts", "32", "--n-held-out", "32",
                      "--out", str(tmp_path)]).data  # fmt: skip
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "circuit.json").read_text())["results"]
    assert saved["level"] == "nodes" and saved["scored_with"] == "eap" and saved["curve"] == []
    among = "; pruned among its nodes)" if saved["edges_pruned"] else "; every edge among its nodes)"
    assert among in out and "a circuit of nodes: asked for by --level nodes" in out
    assert out.splitlines()[0].startswith("circuit: eap scores (noising)")
    estimated = [n for n in r["nodes"] if n not in r["node_costs"]]
    assert all(f"{n}: side not measured" in out for n in r["nodes"])
    assert all("to first order (attribution)" in next(line for line in out.splitlines() if line.startswith(f"  {n}:"))
               for n in estimated)  # fmt: skip
    assert (tmp_path / "circuit_curve.png").exists() and (tmp_path / "circuit_graph.png").exists()
