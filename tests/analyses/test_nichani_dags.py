"""``analyses.nichani_dags``: one job per DAG of Nichani et al. through ``models.training.sweep``; the edges measured
are their DAG's, the CatFormer's number is their measure read from its A (the softmax of the masked positional
block, recomputed here from the saved weights), the GPT-2's its own pattern, and the summary is the mean and the
standard deviation over DAGs (NumPy's, as their notebook) with the standard error. Run records: a partial file
counts each DAG once and never mixes runs; a re-plot never writes over what it reads; a re-run resumes; sizes
are checked before any training."""

from __future__ import annotations

import json

import inproc
import numpy as np
import pytest
import torch

from analyses import common, nichani_dags
from probes.jax_random import nichani_dags as their_dags

TINY = ["--steps", "3", "--batch-size", "16", "--n-contexts", "8"]


def test_their_per_dag_values_give_their_mean_and_std():
    """The 20 numbers transcribed from their notebook's output reproduce its printed summary."""
    assert np.mean(nichani_dags.THEIRS_PER_DAG) == pytest.approx(nichani_dags.THEIRS["mean"], abs=1e-7)
    assert np.std(nichani_dags.THEIRS_PER_DAG) == pytest.approx(nichani_dags.THEIRS["std"], abs=1e-7)


def test_a_tiny_catformer_sweep_measures_their_edges_from_A(tmp_path):
    out = tmp_path / "out"
    nichani_dags.main(["--dags", "2,5", *TINY, "--out", str(out)])
    (s,) = json.loads((out / "nichani_dags.json").read_text())["results"]["sweeps"]
    dags = their_dags()
    assert s["model"] == "catformer" and s["steps"] == 3 and s["lr"] == 1.0
    for run in s["runs"]:
        edges = [(i, p) for i, p in enumerate(dags[run["index"]]) if p >= 0]
        assert [tuple(e) for e in run["edges"]] == edges
        # their measure from the saved A: softmax(where(tri(T), A[d:, d:], -inf)) on each edge, in NumPy
        A = np.load(out / "models" / f"dag_{run['index']:02d}" / "catformer.npz")["A.0"][0, 3:, 3:].astype(np.float64)
        A = np.where(np.tri(20, dtype=bool), A, -np.inf)
        soft = np.exp(A - A.max(-1, keepdims=True))
        soft /= soft.sum(-1, keepdims=True)
        np.testing.assert_allclose(run["attention_on_parent"], [soft[i, p] for i, p in edges], atol=1e-6)
        assert run["parent_attention"] == pytest.approx(np.mean([soft[i, p] for i, p in edges]), abs=1e-6)
    per_dag = [r["parent_attention"] for r in s["runs"]]
    assert s["mean"] == pytest.approx(np.mean(per_dag)) and s["std"] == pytest.approx(np.std(per_dag))
    assert s["se"] == pytest.approx(np.std(per_dag, ddof=1) / np.sqrt(2))
    theirs = [nichani_dags.THEIRS_PER_DAG[i] for i in (2, 5)]
    assert s["minus_theirs"]["mean"] == pytest.approx(np.mean(per_dag) - np.mean(theirs))
    replot = tmp_path / "replot"
    nichani_dags.main(["--sweep", str(out / "nichani_dags_partial.jsonl"), "--out", str(replot)])
    assert json.loads((replot / "nichani_dags.json").read_text())["results"]["sweeps"][0]["mean"] == pytest.approx(s["mean"])


def test_the_gpt2_attention_is_the_models_pattern_at_the_parent():
    run = nichani_dags.train_gpt2_dag(index=0, steps=2, batch_size=8, lr=1e-3, seed=0, n_contexts=4)
    i, p = run["edges"][0]
    assert 0 <= p < i and len(run["attention_on_parent"]) == 2  # two layers, one head each
    assert len(run["attention_on_parent"][0][0]) == sum(q >= 0 for q in their_dags()[0])


def test_the_committed_gpt2_sweep_and_a_catformer_sweep_plot_side_by_side(tmp_path):
    out = tmp_path / "out"
    nichani_dags.main(["--dags", "0", *TINY, "--out", str(out)])
    gpt2 = nichani_dags.COMMITTED["gpt2"]
    nichani_dags.main(["--sweep", str(out / "nichani_dags.json"), str(gpt2), "--out", str(tmp_path / "both")])
    res = json.loads((tmp_path / "both" / "nichani_dags.json").read_text())["results"]
    cat, gpt = res["sweeps"]
    assert (cat["model"], gpt["model"]) == ("catformer", "gpt2") and gpt["n_dags"] == 5
    old = json.loads(gpt2.read_text())
    assert gpt["mean"] == pytest.approx(old["results"]["mean"]) and gpt["trained_by"] == old["command"]


def line(index: int, value: float, **run) -> str:
    return json.dumps({"index": index, "model": "catformer", "edges": [[1, 0]], "parent_attention": value,
                       "last_nll": 0.5, "last_nll_bayes": 0.4, "run": {"steps": 3, **run}})  # fmt: skip


def test_a_partial_file_counts_each_dag_once_and_refuses_mixed_runs(tmp_path):
    """Two runs that shared a partial file once gave "n_dags 2" for DAG 0 written twice."""
    partial = tmp_path / "nichani_dags_partial.jsonl"
    partial.write_text(line(0, 0.8) + "\n" + line(0, 0.8) + "\n")
    nichani_dags.main(["--sweep", str(partial), "--out", str(tmp_path / "a")])
    assert json.loads((tmp_path / "a" / "nichani_dags.json").read_text())["results"]["sweeps"][0]["n_dags"] == 1
    partial.write_text(line(0, 0.8) + "\n" + line(0, 0.6, seed=1) + "\n")
    r = inproc.run("analyses.nichani_dags", "--sweep", str(partial), "--out", str(tmp_path / "b"), cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "mixes" in r.stderr, r.stderr
    assert not (tmp_path / "b" / "nichani_dags.json").exists()


def test_a_replot_never_writes_over_the_record_it_reads(tmp_path):
    """``--sweep X --out <X's folder>`` once replaced X (the seed, the sizes and the training command) by the re-plot."""
    out = tmp_path / "out"
    nichani_dags.main(["--dags", "1", *TINY, "--out", str(out)])
    before = (out / "nichani_dags.json").read_bytes()
    r = inproc.run("analyses.nichani_dags", "--sweep", str(out / "nichani_dags.json"), "--out", str(out), cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "write over" in r.stderr, r.stderr
    assert (out / "nichani_dags.json").read_bytes() == before


def test_a_rerun_resumes_from_the_finished_dags_and_refuses_another_runs(tmp_path, monkeypatch):
    out = tmp_path / "out"
    nichani_dags.main(["--dags", "3", *TINY, "--out", str(out)])
    trained = []
    real = nichani_dags.TRAIN["catformer"]
    monkeypatch.setitem(nichani_dags.TRAIN, "catformer", lambda **kw: trained.append(kw["index"]) or real(**kw))
    nichani_dags.main(["--dags", "3,4", *TINY, "--out", str(out)])
    assert trained == [4]  # DAG 3 finished in the first run
    res = json.loads((out / "nichani_dags.json").read_text())["results"]["sweeps"][0]
    assert [r["index"] for r in res["runs"]] == [3, 4]
    with pytest.raises(SystemExit) as e:  # other settings into the same folder: refused before any training
        nichani_dags.main(["--dags", "5", "--steps", "4", "--batch-size", "16", "--n-contexts", "8", "--out", str(out)])
    assert e.value.code == 2 and trained == [4]


def test_n_contexts_is_sized_before_any_training(tmp_path, capsys):
    """``--n-contexts 10000000`` once failed in the allocator after every DAG had trained."""
    with pytest.raises(SystemExit) as e:
        nichani_dags.main(["--dags", "0", "--steps", "1", "--batch-size", "2", "--n-contexts", "10000000",
                           "--out", str(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--n-contexts 10000000" in err and "would need" in err
    assert not (tmp_path / "nichani_dags_partial.jsonl").exists() and not (tmp_path / "models").exists()


@pytest.mark.parametrize("dags", ["20", "a-b", "3,3"])
def test_bad_dags_are_one_line_and_exit_2(dags, tmp_path):
    r = inproc.run("analyses.nichani_dags", "--dags", dags, "--out", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "--dags" in r.stderr and len(r.stderr.strip().splitlines()) <= 2


def test_the_saved_catformer_opens_with_its_training_positions(tmp_path):
    """Each DAG's model is kept and opens through --checkpoint; its trained positions are the last token's."""
    import models

    nichani_dags.main(["--dags", "0", *TINY, "--out", str(tmp_path)])
    subject = models.load_subject(tmp_path / "models" / "dag_00" / "catformer.npz")
    assert subject.family == "CatFormer" and subject.trained_on == "last"
    ids = torch.randint(0, 3, (4, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(subject.model(ids)[:, -1], subject.model.last_logits(ids), atol=1e-6)


def test_inspect_refuses_a_saved_dag_model_in_one_line(tmp_path, capsys):
    """Their task draws roots from each context's stationary distribution, which has no exact Bayes predictive
    here: inspect refuses the saved model by what it needs, not with an error inside the oracle."""
    from analyses import inspect

    nichani_dags.main(["--dags", "0", *TINY, "--out", str(tmp_path / "sweep")])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        inspect.main(["--checkpoint", str(tmp_path / "sweep" / "models" / "dag_00" / "catformer.npz"),
                      "--n-contexts", "16", "--out", str(tmp_path / "inspect")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "task with a Bayes oracle" in err[0], err


def test_a_torn_last_record_is_dropped_on_resume_and_no_finished_dag_is_lost(tmp_path, monkeypatch, capsys):
    """With --out on a full disk the record ended in half a line, and once space was back the same command refused
    to resume ("line 4 is not a DAG's result"): finished DAGs lost without hand edits (issue 52)."""
    out = tmp_path / "out"
    nichani_dags.main(["--dags", "3", *TINY, "--out", str(out)])
    partial = out / "nichani_dags_partial.jsonl"
    whole = partial.read_text()
    partial.write_text(whole + whole[: len(whole) // 2])  # a second record cut short
    trained = []
    real = nichani_dags.TRAIN["catformer"]
    monkeypatch.setitem(nichani_dags.TRAIN, "catformer", lambda **kw: trained.append(kw["index"]) or real(**kw))
    capsys.readouterr()
    nichani_dags.main(["--dags", "3,4", *TINY, "--out", str(out)])
    assert trained == [4] and "dropped its torn last line" in capsys.readouterr().out  # DAG 3 kept, said so
    assert partial.read_text().startswith(whole) and partial.read_text().endswith("\n")
    res = json.loads((out / "nichani_dags.json").read_text())["results"]["sweeps"][0]
    assert [r["index"] for r in res["runs"]] == [3, 4]


def test_a_second_sweep_into_the_same_folder_is_refused_at_once(tmp_path, capsys):
    """A second run into the same --out was not refused (no lock): one died, the record held DAG 0 twice."""
    from models.plumbing.io import exclusive_lock

    out = tmp_path / "out"
    out.mkdir()
    with exclusive_lock(out / ".nichani_dags.lock", what="a sweep"):  # as a first run holds it while it trains
        with pytest.raises(SystemExit) as e:
            common.run_cli(nichani_dags.main, ["--dags", "3", *TINY, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "another process is writing the nichani_dags sweep" in err[0], err
    assert not (out / "nichani_dags_partial.jsonl").exists()
