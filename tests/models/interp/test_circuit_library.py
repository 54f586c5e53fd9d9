"""models.interp.circuit as a library (issue 42): ``discover(subject, CircuitConfig(...)) -> CircuitResult``, a
config that refuses what no registry knows, corruptions added by one registration (the how-to's, run as written,
and a toy one of this file), nodes as typed values, the notebook call equal to the command line's JSON, the
docs' examples run, and no share of a progress that is not there (issue 41)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from pathlib import Path

import forked
import pytest
import torch
from conftest import build_task
from constructed import transposed_subject

import models
from models.interp.circuit import (
    CORRUPTIONS,
    INPUTS,
    METHODS,
    SEARCHES,
    CircuitConfig,
    Corruption,
    Node,
    build_graph,
    discover,
    register_corruption,
)
from models.interp.subject import load_subject

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "docs" / "scripts"))
import tutorials  # noqa: E402


@pytest.mark.parametrize(
    "field, value, known",
    [("corruptions", ("demonstrations", "nonsense"), CORRUPTIONS), ("method", "eap-ig2", METHODS),
     ("search", "beam", SEARCHES)],
)  # fmt: skip
def test_a_name_no_registry_knows_is_refused_when_the_config_is_built(field, value, known):
    """One line naming the field and every registered name; a corruption with no corrupted run (mean)
    is refused for denoising there too, and a malformed node label before any model is read."""
    with pytest.raises(ValueError) as e:
        CircuitConfig(**{field: value})
    message = str(e.value)
    assert "\n" not in message and message.startswith(field) and all(name in message for name in known)
    with pytest.raises(ValueError, match="^direction denoising needs a corruption that is a run on other contexts"):
        CircuitConfig(direction="denoising", corruptions=("demonstrations", "mean"))
    with pytest.raises(ValueError, match="no node 'L1X2'"):
        CircuitConfig(nodes=("L1X2",))
    assert CircuitConfig(corruptions="target, resample").corruptions == ("target", "resample")  # as --corruption


def test_every_node_of_a_graph_is_a_typed_value_that_reads_back_from_its_label():
    """Each node of the standard GPT-2's and the disentangled model's graphs: its label parses back to it,
    and a head's layer and head are those of the hooks its receivers read (``blocks.{layer}.attn.hook_q``,
    head index) and an MLP's layer that of its ``hook_mlp_out``; a node equals its label."""
    task = build_task(n_examples=3, seq_len=4)
    theorem1 = models.interp.subject.subject_of(models.theorem1_model(task.pi, 3, 4, 5.0), task, None, "t", "0")
    for subject in (load_subject("standard"), theorem1):
        graph = build_graph(subject)
        for r in graph.receivers:
            n = r.node
            assert Node.parse(str(n)) == n and n == str(n) and hash(n) == hash(str(n))
            if n.kind == "head":
                assert (r.capture.split(".")[1], r.head) == (str(n.layer), n.head) and r.input in INPUTS
            elif n.kind == "mlp":
                assert r.capture == f"blocks.{n.layer}.hook_mlp_out"
            else:
                assert n.kind == "output" and r.capture is None
        for e in graph.edges:
            assert e.to_dict()["sender"] == str(e.sender) and type(e.sender) is Node
    for bad in ("L1", "H2", "MLP", "mlp0", "L1H2H3", ""):
        with pytest.raises(ValueError, match="expected a head"):
            Node.parse(bad)


def _unchanged(task, tokens, generator):
    """A toy corruption: the other contexts are the contexts themselves, so every ablated value is clean."""
    return tokens.clone()


def test_a_corruption_registered_once_is_what_discover_ablates_with():
    """A new corruption is one registration: registered here, ``discover`` runs with it end to end. Its
    ablated values are the clean ones, so every edge scores exactly 0 and any circuit keeps exactly all of
    the progress (the empty one included: the search keeps no edge); the JSON uses its words."""
    register_corruption(
        Corruption("unchanged", "the sender's own clean value", "keeps what nothing removes", _unchanged)
    )
    try:
        with pytest.raises(ValueError, match="registered already"):
            register_corruption(Corruption("unchanged", "", "", _unchanged))
        subject = transposed_subject(build_task(n_examples=3, seq_len=4, alpha=0.3))
        r = discover(subject, CircuitConfig(n_contexts=16, n_held_out=32, corruptions=("unchanged",), curve_points=2))
        d = r.to_dict()
        assert all(e["score"] == 0 for e in d["all_edges"]) and d["edges"] == []
        assert d["held_out"]["faithfulness_unchanged"] == pytest.approx(1.0, abs=1e-12)
        assert (
            d["corruption"] == "the sender's own clean value"
            and d["faithfulness_means"] == "keeps what nothing removes"
        )
        assert r.nodes and r.sufficiency.value == pytest.approx(1.0, abs=1e-6)  # the nodes its costs name compute BMA
    finally:
        CORRUPTIONS.pop("unchanged")


def _run_blocks(page: Path, *, pop: tuple = (), calling: str = "") -> str:
    """Exec the page's Python blocks (those containing ``calling``) at their ``# quick:`` sizes, in order, in
    one namespace; what they print. ``pop``: corruptions they register, removed afterwards."""
    import contextlib
    import io

    printed = io.StringIO()
    namespace: dict = {"__name__": "__main__"}
    try:
        with contextlib.redirect_stdout(printed):
            for code in (c for c in tutorials.blocks(page.read_text()) if calling in c):
                exec(compile(tutorials.quick(code), str(page), "exec"), namespace)
    finally:
        for name in pop:
            CORRUPTIONS.pop(name, None)
    return printed.getvalue()


@pytest.mark.slow
def test_the_howto_adds_a_corruption_as_it_says_and_the_explanation_example_runs():
    """docs/howto/add_intervention.md's blocks, as written (quick sizes): its corruption is registered and
    used, and its words are the JSON's; docs/explanation/circuit.md's example prints a circuit."""
    out = _run_blocks(ROOT / "docs" / "howto" / "add_intervention.md", pop=("swapped",))
    assert "another context's demonstrations (the same target) Estimate(value=" in out
    out = _run_blocks(ROOT / "docs" / "explanation" / "circuit.md")
    assert re.search(
        r"\d+ of \d+ edges; heads of layer 0: \d+\ncarries the demonstrations' evidence: [\d.-]+ \+- ", out
    )


def _numbers_equal(a, b, path=""):
    """Every number of two JSON-like values within 1e-9, everything else equal; the paths that differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in set(a) | set(b) for p in (
            _numbers_equal(a[k], b[k], f"{path}/{k}") if k in a and k in b else [f"{path}/{k}"])]  # fmt: skip
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [path]
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in _numbers_equal(x, y, f"{path}[{i}]")]
    if isinstance(a, float) or isinstance(b, float):
        return [] if abs(a - b) <= 1e-9 or (math.isnan(a) and math.isnan(b)) else [path]
    return [] if a == b else [path]


@pytest.mark.slow
def test_the_notebook_call_on_the_shipped_gpt2_equals_the_command_lines_json(tmp_path):
    """``discover(models.load_subject("standard"), CircuitConfig(...))`` in this process, as a notebook calls
    it (no eval(), no flags), against ``python -m analyses.circuit`` with the same options in another one:
    every number of the JSON within 1e-9; and docs/results/circuit.md's example runs (quick sizes)."""
    flags = ["--n-contexts", "8", "--n-held-out", "16", "--curve-points", "2", "--corruption", "demonstrations"]
    done = forked.run("analyses.circuit", "--checkpoint", "standard", *flags, "--out", str(tmp_path), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    cli = json.loads((tmp_path / "circuit.json").read_text())["results"]
    config = CircuitConfig(n_contexts=8, n_held_out=16, curve_points=2, corruptions=("demonstrations",))
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # as the command line runs (--threads 1)
    try:
        notebook = json.loads(json.dumps(discover(models.load_subject("standard"), config).to_dict()))
    finally:
        torch.set_num_threads(previous)
    assert notebook["edges"] and _numbers_equal(notebook, cli) == []
    out = _run_blocks(ROOT / "docs" / "results" / "circuit.md", calling="discover(")
    assert re.search(r"\d+ of 722 edges; nodes .*\nfaithfulness [\d.-]+ \+- [\d.]+, sufficiency", out)


def test_a_model_without_progress_gets_no_circuit_and_no_share():
    """theorem1:beta=1e-9 attends uniformly: its progress over the plateau is ~0 (issue 41: every head was
    reported as its circuit, "sufficiency 1.000 +- 0.000"). The result says why in one line and holds no
    circuit and no share; the progress it reports is (plateau NLL - NLL) / (plateau NLL - BMA NLL) of the
    NLLs it reports, within 2 standard errors of zero. The shipped model, with progress, is not refused."""
    r = discover(load_subject("theorem1:beta=1e-9"), CircuitConfig(n_contexts=64))
    assert r.refused and "\n" not in r.refused and "not beyond 2 standard errors of zero" in r.refused
    assert r.nodes == [] and r.edges == [] and r.held_out is None and r.faithfulness is None and r.sufficiency is None
    d = r.to_dict()
    assert d["refused"] == r.refused and d["edges"] == [] and not {"faithfulness", "sufficiency", "held_out"} & set(d)
    assert (d["nll_plateau"] - d["nll"]) / (d["nll_plateau"] - d["nll_bma"]) == pytest.approx(d["progress"], abs=1e-9)
    assert d["progress"] <= 2 * d["progress_se"] and abs(d["progress"]) < 0.05


def test_a_circuit_that_keeps_less_than_its_target_on_held_out_contexts_says_so():
    """Issue 50: a small search on the paper's model (32 contexts, the demonstrations corruption) met its
    target on its own contexts but kept 0.695 +- 0.056 held out. Whether a held-out answer is beyond 2 SE below
    the target is recomputed here from the answers themselves; the result lists exactly those, and the JSON too."""
    from analyses import circuit

    subject = load_subject("default")
    config = CircuitConfig(n_contexts=16, n_held_out=128, corruptions=("demonstrations",), target=0.99)
    r = discover(subject, config)
    h = r.held_out
    answers = {"faithfulness under demonstrations": h.faithfulness["demonstrations"],
               "sufficiency (mean-ablated)": h.sufficiency["mean"]}  # fmt: skip
    short = [what for what, (share, se) in answers.items() if share + 2 * se < 0.99]
    assert short, "the test needs a search that misses its target held out"
    assert len(r.missed) == len(short) and all(any(what in m for m in r.missed) for what in short)
    assert r.to_dict()["missed_target"] == r.missed
    assert "MISSED ITS TARGET" in circuit.summary(r.to_dict())
    assert not discover(subject, dataclasses.replace(config, n_edges=3)).missed  # no target asked for


def test_the_library_result_gives_the_analysis_summary_and_figures():
    """Issue 50: ``CircuitResult.summary()`` is the text ``python -m analyses.circuit`` prints and ``figures()`` its
    two figures, drawn from the result alone (no analysis imported by the library)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analyses import circuit

    subject = load_subject("default")
    config = CircuitConfig(n_contexts=8, n_held_out=16, curve_points=1, corruptions=("demonstrations",))
    r = discover(subject, config)
    analysed = circuit.run(subject, config)
    assert r.summary() == analysed.summary() and r.summary().startswith("circuit: exact scores")
    figs = r.figures("default")
    try:
        assert set(figs) == set(analysed.figures()) == {"circuit_graph", "circuit_curve"}
        assert figs["circuit_graph"].axes[0].get_title() == analysed.figures()["circuit_graph"].axes[0].get_title() != ""
    finally:
        plt.close("all")
