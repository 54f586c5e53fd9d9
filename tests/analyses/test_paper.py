"""analyses.paper: every analysis it runs declares its figures, the gallery lists exactly those, the
analyses go to the sweep engine as jobs, longest first, bad --jobs and --cluster."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from analyses import common, paper


def test_every_analysis_declares_figures_and_the_gallery_lists_them():
    modules = list(paper.available(common.analysis_names()).values())
    text = paper.gallery(modules)
    for module in modules:
        assert isinstance(module.FIGURES, dict) and module.FIGURES, module.__name__
        assert callable(module.main), module.__name__
        for fig in module.FIGURES:
            assert f"[{fig}]({fig})" in text
    assert text.count("](") == sum(len(m.FIGURES) for m in modules)


def test_the_analyses_run_in_the_papers_order_and_missing_modules_are_skipped(monkeypatch, capsys):
    names = common.analysis_names()
    assert names[: len(common.ORDER)] == common.ORDER  # every analysis the order names, in its order
    real = importlib.import_module

    def fake(name):
        if name == "analyses.not_written":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        if name == "analyses.broken":  # exists, but imports a module that does not
            raise ModuleNotFoundError("No module named 'absent_dependency'", name="absent_dependency")
        return real(name)

    monkeypatch.setattr(paper.importlib, "import_module", fake)
    got = paper.available(["copyers", "not_written", "scale"])
    assert list(got) == ["copyers", "scale"] and got["scale"].NAME == "scale"
    assert "not_written: skipped (analyses.not_written does not exist yet)" in capsys.readouterr().out
    with pytest.raises(ModuleNotFoundError, match="absent_dependency"):
        paper.available(["broken"])


def test_the_analyses_are_jobs_of_the_sweep_engine_started_longest_first(monkeypatch, tmp_path, capsys):
    calls = []

    def run_jobs(fn, kwargs_list, cluster, jobs, threads):
        calls.append((fn, kwargs_list, cluster, jobs, threads))
        return [float(i) for i in range(len(kwargs_list))]

    monkeypatch.setattr(paper.sweep, "run_jobs", run_jobs)
    monkeypatch.setattr(paper, "SECONDS", {"copyers": 5.0, "scale": 50.0, "circuit": 400.0})
    paper.main(["--only", "copyers", "scale", "head_ablation", "--out", str(tmp_path), "--jobs", "2", "--seed", "3"])
    ((fn, kwargs_list, cluster, jobs, threads),) = calls
    assert fn is paper.run_one and (cluster, jobs, threads) == ("local", 2, 1)
    # head_ablation has no measured time: it may be long, so it starts first; then the longest first
    assert [k["name"] for k in kwargs_list] == ["head_ablation", "scale", "copyers"]
    assert all(k["seed"] == 3 and Path(k["out"]).resolve() == tmp_path.resolve() for k in kwargs_list)
    assert "--cluster local --jobs 2" in capsys.readouterr().out


def test_every_measured_time_is_of_an_analysis_and_the_order_is_longest_first():
    names = common.analysis_names()
    assert set(paper.SECONDS) <= set(names)
    order = paper.longest_first(names)
    assert sorted(order) == sorted(names)
    times = [paper.SECONDS.get(name, float("inf")) for name in order]
    assert times == sorted(times, reverse=True)


def test_jobs_must_be_positive(capsys):
    with pytest.raises(SystemExit) as e:
        paper.main(["--jobs", "0", "--only", "copyers"])
    assert e.value.code == 2
    assert "--jobs must be in [1, 1024], got 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seed", "-1", "--only", "copyers"], "--seed must be between 0"),
        (["--out", "/proc/no/such/x", "--only", "copyers"], "is not writable"),
        (["--only", "copyers", "no_such_analysis"], "--only no_such_analysis: not an analysis"),
        (["--only", "copyers", "--cluster", "slurm"], "--cluster 'slurm' names no partition"),
        (["--only", "copyers", "--cluster", "ray://head:10001"], "is not a cluster; expected local"),
    ],
)
def test_bad_flags_exit_2_before_running_anything(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        paper.main(argv)
    assert e.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err and "== copyers" not in captured.out


def test_analyses_fix_the_thread_count_and_reject_a_bad_one(tmp_path, capsys):
    import torch

    from analyses import copyers

    before = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as e:
            copyers.main(["--threads", "0", "--out", str(tmp_path)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "--threads must be" in err and "got 0" in err
        copyers.main(["--threads", "1", "--out", str(tmp_path)])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
