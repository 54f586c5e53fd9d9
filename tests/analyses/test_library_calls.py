"""Every analysis is one Python call: ``module.run(subject, module.Config(...))`` returns a result whose
``figures()`` are matplotlib Figures named as the files ``python -m analyses.NAME`` writes, and whose ``to_dict()``
is the JSON it writes, for the same config (made here from the config's own flags, ``Config.flags``). Each
analysis runs at a quick size on a shipped subject it applies to (the disentangled model, else the GPT-2), or on
its own tasks. No argparse Namespace anywhere on the library path."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import math

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import models  # noqa: E402
from analyses import common, nichani_dags  # noqa: E402
from models.loading.named import NAMED  # noqa: E402

QUICK = {  # name -> config fields small enough for a test (each analysis's own QUICK_CONFIG first)
    "head_ablation": {"n_contexts": 16},
    "activation_patching": {"n_contexts": 16},
    "logpi_recovery": {"n_contexts": 16},
    "block_structure": {"train_steps": 0},
    "bma_agreement": {"n_contexts": 16, "train_lengths": (), "bma_lengths": (1, 2)},
    "init_gradient": {"n_contexts": 16, "n_trees": 2, "steps": 3},
    "information": {"n_contexts": 4},
    "continuous": {"n_contexts": 16, "steps": 2},
    "inspect": {"n_contexts": 16},
    "inspect_standard": {"n_contexts": 16},
    "linear_probes": {"n_contexts": 32, "standard": str(NAMED["standard"])},
    "standard_circuit": {"n_contexts": 64},
    "circuit": {"n_contexts": 8, "n_held_out": 16, "curve_points": 1, "corruptions": ("demonstrations",)},
    "standard_vs_disentangled": {"disentangled_steps": 2, "eval_every": 1},
    "trajectory": {"n_contexts": 16, "train_steps": 4, "snapshot_every": 2},
    "nichani_dags": {"sweep": tuple(str(p) for p in nichani_dags.COMMITTED.values())},
    "cape_structure": {"n_contexts": 8},
    "cape_properties": {"n_contexts": 2, "nodes": 4, "dim": 2, "n_queries": 4, "n_perm": 1},
    "cape_downstream": {"n_contexts": 8, "model_seeds": 1, "steps": 2, "n_train": 16, "variants": "none,cape"},
}
TIMES = ("seconds", "cpu_seconds", "wall", "load_average")  # when a run took place, not what it measured


@pytest.fixture(scope="module")
def shipped() -> dict:
    return {name: models.load_subject(name) for name in ("default", "standard")}


def subject_for(analysis: common.Analysis, shipped: dict):
    """None for an analysis of its own tasks, else its default checkpoint (as its command line's), or the first
    shipped subject it applies to."""
    if analysis.requires is None:
        return None
    order = [shipped[analysis.checkpoint], *shipped.values()]
    return next(s for s in order if analysis.requires <= s.capabilities)


def same(saved, computed, where="results") -> list[str]:
    """Where two JSON values differ beyond float rounding (NaN equals NaN), times left out."""
    if isinstance(saved, dict) and isinstance(computed, dict):
        if saved.keys() != computed.keys():
            return [f"{where}: keys {sorted(saved.keys() ^ computed.keys())}"]
        return [d for k in saved if k not in TIMES for d in same(saved[k], computed[k], f"{where}.{k}")]
    if isinstance(saved, list) and isinstance(computed, list):
        if len(saved) != len(computed):
            return [f"{where}: {len(saved)} against {len(computed)} items"]
        return [d for i, (a, b) in enumerate(zip(saved, computed)) for d in same(a, b, f"{where}[{i}]")]
    if isinstance(saved, float) or isinstance(computed, float):
        a, b = float(saved), float(computed)
        return [] if (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) else [
            f"{where}: {a} against {b}"]
    return [] if saved == computed else [f"{where}: {saved!r} against {computed!r}"]


@pytest.mark.slow
@pytest.mark.parametrize("name", common.analysis_names())
def test_run_gives_the_figures_and_json_that_main_writes(name, shipped, tmp_path):
    module = importlib.import_module(f"analyses.{name}")
    subject = subject_for(module.ANALYSIS, shipped)
    config = module.Config(**{**getattr(module, "QUICK_CONFIG", {}), **QUICK.get(name, {})})
    with common.single_thread():
        result = module.run(subject, config)
        figs = result.figures()
        computed = result.to_dict()
        module.main([*(subject.load_flags if subject else []), *config.flags(), "--out", str(tmp_path)])
    try:
        assert figs and all(isinstance(f, Figure) for f in figs.values()) or module.ANALYSIS.pages is not None
        assert set(figs) == {p.stem for p in tmp_path.glob("*.png")} == {p.stem for p in tmp_path.glob("*.pdf")}
        assert set(result.pages()) == {p.name for p in tmp_path.glob("*.html")}
    finally:
        for fig in figs.values():
            plt.close(fig)
    saved = json.loads((tmp_path / f"{name}.json").read_text())
    assert saved["command"] == computed["command"] and computed["command"].startswith(f"python -m analyses.{name}")
    assert same(saved, computed, "json") == []


def test_no_function_on_the_library_path_takes_a_namespace():
    """Every hook of every analysis takes a subject, a config, a result or data: none is annotated with, or
    named for, an argparse Namespace."""
    for name, analysis in common.registry().items():
        for hook in (analysis.compute, analysis.figures, analysis.summary, analysis.record, analysis.pages):
            if hook is None:
                continue
            for p in inspect.signature(hook).parameters.values():
                assert p.name != "args" and p.annotation not in (argparse.Namespace, "argparse.Namespace"), (name, hook)


def test_a_config_is_frozen_and_checked_where_it_is_made():
    from analyses import circuit
    from analyses import inspect as inspect_analysis

    config = inspect_analysis.Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.n_contexts = 3
    assert dataclasses.replace(config, n_contexts=3).n_contexts == 3
    for bad, kind in ((dict(n_contexts=2.5), TypeError), (dict(n_contexts=True), TypeError),
                      (dict(seed=2**70), ValueError), (dict(positions="first"), ValueError)):  # fmt: skip
        with pytest.raises(kind, match=next(iter(bad))):
            inspect_analysis.Config(**bad)
    for bad in (dict(min_z=float("nan")), dict(ig_steps=8.0), dict(n_edges=2.5)):
        with pytest.raises((TypeError, ValueError), match=next(iter(bad))):
            circuit.Config(**bad)


def test_a_python_call_raises_exceptions_not_systemexit(shipped):
    from analyses import copyers, head_ablation, information

    with pytest.raises(TypeError, match="models.load_subject"):
        head_ablation.run(shipped["default"].model, head_ablation.Config())
    with pytest.raises(TypeError, match="Config"):
        head_ablation.run(shipped["default"], "n_contexts=16")
    with pytest.raises(TypeError, match="takes no subject"):
        information.run(shipped["default"], information.Config())
    with pytest.raises(ValueError, match="needs a model with disentangled residual"):
        head_ablation.run(shipped["standard"], head_ablation.Config(n_contexts=16))
    import torch

    r = copyers.run(shipped["default"])  # the default config, on the thread count torch has here
    assert r.command == f"python -m analyses.copyers --checkpoint default --threads {torch.get_num_threads()}"
    assert r.to_dict()["checkpoint"] == "default"
