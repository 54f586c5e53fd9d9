"""``analyses.nichani_dags``: one job per DAG of Nichani et al. through ``models.training.sweep``; the edges measured
are their DAG's, the attention is read from the model's own pattern, and the summary is the mean and the
standard deviation over DAGs (NumPy's, as their notebook)."""

from __future__ import annotations

import json

import inproc
import numpy as np
import pytest

from analyses import nichani_dags
from probes.jax_random import nichani_dags as their_dags


def test_a_tiny_sweep_measures_their_edges(tmp_path):
    out = tmp_path / "out"
    nichani_dags.main(["--dags", "2,5", "--steps", "3", "--batch-size", "16", "--n-contexts", "8", "--out", str(out)])
    res = json.loads((out / "nichani_dags.json").read_text())["results"]
    dags = their_dags()
    for run in res["runs"]:
        assert [tuple(e) for e in run["edges"]] == [(i, p) for i, p in enumerate(dags[run["index"]]) if p >= 0]
        att = np.array(run["attention_on_parent"][0][0])
        assert ((att > 0) & (att < 1)).all() and run["mean_attention_on_parent"][0][0] == pytest.approx(att.mean())
    per_dag = [r["mean_attention_on_parent"][0][0] for r in res["runs"]]
    assert res["mean"] == pytest.approx(np.mean(per_dag)) and res["std"] == pytest.approx(np.std(per_dag))
    partial = (out / "nichani_dags_partial.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["index"] for line in partial) == [2, 5]
    replot = tmp_path / "replot"
    nichani_dags.main(["--sweep", str(out / "nichani_dags_partial.jsonl"), "--out", str(replot)])
    assert json.loads((replot / "nichani_dags.json").read_text())["results"]["mean"] == pytest.approx(res["mean"])


def test_the_attention_is_the_models_pattern_at_the_parent():
    run = nichani_dags.train_dag(index=0, steps=2, batch_size=8, seed=0, n_contexts=4)
    i, p = run["edges"][0]
    assert 0 <= p < i and len(run["attention_on_parent"]) == 2  # two layers, one head each
    assert len(run["attention_on_parent"][0][0]) == sum(q >= 0 for q in their_dags()[0])


@pytest.mark.parametrize("dags", ["20", "a-b", "3,3"])
def test_bad_dags_are_one_line_and_exit_2(dags, tmp_path):
    r = inproc.run("analyses.nichani_dags", "--dags", dags, "--out", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "--dags" in r.stderr and len(r.stderr.strip().splitlines()) <= 2
