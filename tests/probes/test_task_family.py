"""The task family (probes.graph_task) and its oracles (probes.oracles), against independent computations:
Bayes predictives against brute-force enumeration of trees and numerical integration over the kernel
(Gauss-Legendre quadrature, exact for the polynomial integrands of Dirichlet(1); for Dirichlet(1/2) after
the substitution p = sin^2(phi), which leaves a trigonometric polynomial), the samplers' statistics
against the kernel they drew from, our task bit for bit, task.json round trips, and bad input."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import forked
import numpy as np
import pytest
import torch

from models.loading.sources.task_json import read_task
from models.training.standard import StandardConfig
from models.training.train import TrainConfig
from probes import MarkovTreeTask
from probes.graph_task import GraphTask, make_task, relative_offsets
from probes.layout import Layout
from probes.metrics import target_nll
from probes.oracles import MAX_TREES, bayes, distances, stationary, strategies

ROOT = Path(__file__).resolve().parents[2]


# Brute force: the posterior predictive by integrating over every kernel row ---------------------------
def _row_nodes(alpha: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes p in (0, 1) and weights of the Beta(alpha, alpha) prior for d = 2 (integrals exact to ~1e-13)."""
    x, w = np.polynomial.legendre.leggauss(n)
    if alpha == 1.0:
        return (x + 1) / 2, w / 2
    assert alpha == 0.5  # Beta(1/2, 1/2): p = sin^2(phi), density dp = (2 / pi) dphi on (0, pi/2)
    phi = (x + 1) * math.pi / 4
    return np.sin(phi) ** 2, w * (math.pi / 4) * (2 / math.pi)


def brute_force_predictive(x: np.ndarray, rows_of, alpha: float, n_nodes: int = 12) -> np.ndarray:
    """P(x_h^target = 1 | seen) for d = 2 at every target position h >= 1, integrating the joint likelihood
    of everything seen over a tensor grid of every row's parameter (no counts, no conjugacy).
    ``x`` [L+1, H]; ``rows_of(l, h)`` -> the row that token's distribution is (None: a root, known uniform)."""
    L1, H = x.shape
    rows = sorted({rows_of(l, h) for l in range(L1) for h in range(H)} - {None})
    p, w = _row_nodes(alpha, n_nodes)
    grid = np.array(list(itertools.product(range(n_nodes), repeat=len(rows))))  # [G, R]
    theta = p[grid]  # P(token = 1 | row r) at each grid point
    weight = np.prod(w[grid], 1)
    column = {r: i for i, r in enumerate(rows)}

    def lik(l, h):
        r = rows_of(l, h)
        if r is None:
            return np.full(len(grid), 0.5)
        t = theta[:, column[r]]
        return t if x[l, h] == 1 else 1 - t

    seen = np.ones(len(grid))
    for l in range(L1 - 1):
        for h in range(H):
            seen = seen * lik(l, h)
    out = np.full(H, np.nan)
    for h in range(H):
        r = rows_of(L1 - 1, h)
        if r is not None:
            out[h] = (weight * seen * theta[:, column[r]]).sum() / (weight * seen).sum()
        seen = seen * lik(L1 - 1, h)
    return out


def _rows_of_graph(x: np.ndarray, parents: list[list[int]]):
    def rows_of(l, h):
        ps = parents[h]
        return None if not ps else (len(ps), tuple(int(x[l, p]) for p in ps))

    return rows_of


@pytest.mark.parametrize(
    ("spec", "alpha", "L", "H", "n_nodes"),
    [  # Dirichlet(1): 8 nodes integrate polynomials of degree 15 exactly; Dirichlet(1/2): converged
        ("chain:kernel=dirichlet", 1.0, 1, 6, 8),
        ("chain:kernel=dirichlet", 0.5, 2, 4, 40),
        ("ngram:n=3:kernel=dirichlet", 1.0, 0, 7, 8),
        ("ngram:n=3:kernel=dirichlet", 0.5, 0, 5, 20),
        ("given:parents=[[],[0],[0,1],[1],[2,3]]:kernel=dirichlet", 1.0, 1, 5, 8),
        ("random_dag:parents=2:seed=1:kernel=dirichlet", 1.0, 0, 5, 8),
    ],
)
def test_dirichlet_count_estimate_is_the_posterior_predictive(spec, alpha, L, H, n_nodes):
    task = make_task(spec, 2, L, H, alpha=alpha)
    tokens, _ = task.sample(6, torch.Generator().manual_seed(3))
    ours = bayes(task, tokens)[0].exp()[..., 1].numpy()
    for b in range(len(tokens)):
        x = tokens[b].view(L + 1, H).numpy()
        ref = brute_force_predictive(x, _rows_of_graph(x, task.parents), alpha, n_nodes)
        np.testing.assert_allclose(ours[b, 1:], ref[1:], rtol=0, atol=1e-10)


def test_random_tree_with_dirichlet_kernel_against_enumerated_trees():
    """Every tree, each integrated over the kernel: the mixture predictive and the parent posterior."""
    L, H, alpha = 1, 4, 1.0
    task = make_task("random_tree:kernel=dirichlet", 2, L, H, alpha=alpha)
    tokens, _ = task.sample(5, torch.Generator().manual_seed(1))
    pred, posterior = bayes(task, tokens)
    p, w = _row_nodes(alpha, 10)
    grid = np.array(list(itertools.product(range(10), repeat=2)))
    theta, weight = p[grid], np.prod(w[grid], 1)  # rows: parent value 0 and 1
    for b in range(len(tokens)):
        x = tokens[b].view(L + 1, H).numpy()
        num, den, post = np.zeros(H), np.zeros(H), np.zeros((H, H))
        for choice in itertools.product(*[range(h) for h in range(1, H)]):
            tree = [-1, *choice]

            def lik(l, h, tree=tree):
                if h == 0:
                    return np.full(len(grid), 0.5)
                t = theta[:, x[l, tree[h]]]
                return t if x[l, h] == 1 else 1 - t

            seen = np.prod([lik(0, h) for h in range(H)], 0) * weight
            for h in range(H):
                if h:
                    num[h] += (seen * theta[:, x[L, tree[h]]]).sum()
                    den[h] += seen.sum()
                    post[h, tree[h]] += seen.sum()
                seen = seen * lik(L, h)
        np.testing.assert_allclose(pred[b, 1:, 1].exp().numpy(), num[1:] / den[1:], rtol=0, atol=1e-10)
        np.testing.assert_allclose(posterior[b, 1:].numpy(), post[1:] / den[1:, None], rtol=0, atol=1e-10)


def test_random_tree_with_dirichlet_kernel_refuses_what_it_cannot_enumerate():
    task = make_task("random_tree:kernel=dirichlet", 2, 1, 8)
    assert math.factorial(7) > MAX_TREES
    with pytest.raises(ValueError, match=r"\(H-1\)! = 5040 trees"):
        bayes(task, task.sample(2)[0])
    with pytest.raises(ValueError, match=r"seq_len 8: .* 5040 trees"):
        TrainConfig(task_kind="random_tree:kernel=dirichlet", seq_len=8)


def test_our_bma_is_the_posterior_predictive_over_enumerated_trees():
    """Lemma 1 against the sum over every tree of the likelihood of everything seen (pi known)."""
    task = MarkovTreeTask.random(3, 2, 4, seed=5)
    tokens, _ = task.sample(4, torch.Generator().manual_seed(2))
    pi = task.pi.numpy()
    ours = bayes(task, tokens)[0].exp().numpy()
    for b in range(len(tokens)):
        x = tokens[b].view(3, 4).numpy()
        for h in range(1, 4):
            num, den = np.zeros(3), 0.0
            for choice in itertools.product(*[range(g) for g in range(1, 4)]):
                tree = [-1, *choice]
                like = np.prod([pi[x[l, tree[g]], x[l, g]] for l in range(2) for g in range(1, 4)])
                like *= np.prod([pi[x[2, tree[g]], x[2, g]] for g in range(1, h)])
                num += like * pi[x[2, tree[h]]]
                den += like
            np.testing.assert_allclose(ours[b, h], num / den, rtol=1e-10)


def test_fixed_graph_fixed_kernel_bayes_is_the_marginal_of_enumerated_sequences():
    """Graph and kernel known: P(x_h | x_<h) as a ratio of marginals, each a sum over every target sequence
    of the product of its table entries (row of parents p_0 < p_1: d x_{p_0} + x_{p_1}); demonstrations and
    later positions drop out of it."""
    parents = [[], [0], [0, 1], [2]]
    task = make_task("given:parents=[[],[0],[0,1],[2]]", 3, 1, 4, alpha=0.5, task_seed=4)
    tokens, _ = task.sample(20, torch.Generator().manual_seed(0))
    pred = bayes(task, tokens)[0].exp().numpy()
    tables = {k: t.numpy() for k, t in task.tables.items()}

    def joint(seq) -> float:
        out = 1.0
        for h, ps in enumerate(parents):
            row = sum(seq[p] * 3 ** (len(ps) - 1 - j) for j, p in enumerate(ps))
            out *= 1 / 3 if not ps else tables[len(ps)][row, seq[h]]
        return out

    every = {seq: joint(seq) for seq in itertools.product(range(3), repeat=4)}
    marginal = lambda prefix: sum(p for seq, p in every.items() if seq[: len(prefix)] == prefix)  # noqa: E731
    for b in range(len(tokens)):
        x = tuple(tokens[b, 4:].tolist())
        for h in range(4):
            want = [marginal(x[:h] + (s,)) / marginal(x[:h]) for s in range(3)]
            np.testing.assert_allclose(pred[b, h], want, rtol=1e-12)


# Strategies ---------------------------------------------------------------------------------------------
def test_unigram_and_bigram_are_add_one_counts_of_what_was_seen():
    task = make_task("chain:kernel=dirichlet", 3, 2, 5)
    tokens, _ = task.sample(8, torch.Generator().manual_seed(7))
    got = strategies(task, tokens)
    for b in range(8):
        x = tokens[b].view(3, 5).tolist()
        for h in range(1, 5):
            seen = [(l, g) for l in range(2) for g in range(5)] + [(2, g) for g in range(h)]
            uni = np.ones(3)
            bi = np.ones(3)
            for l, g in seen:
                uni[x[l][g]] += 1
                if g > 0 and x[l][g - 1] == x[2][h - 1]:
                    bi[x[l][g]] += 1
            np.testing.assert_allclose(got["unigram"][b, h].exp().numpy(), uni / uni.sum(), rtol=1e-12)
            np.testing.assert_allclose(got["bigram"][b, h].exp().numpy(), bi / bi.sum(), rtol=1e-12)
    # with Dirichlet(1) rows on a chain, Bayes is the add-one bigram (the root aside)
    torch.testing.assert_close(got["bayes"][:, 1:], got["bigram"][:, 1:])


def test_trigram_strategy_on_an_ngram_task_and_stationary_on_a_fixed_kernel():
    task = make_task("ngram:n=3:kernel=dirichlet", 2, 1, 6)
    tokens = task.sample(4, torch.Generator().manual_seed(3))[0]
    got = strategies(task, tokens)
    assert set(got) == {"uniform", "unigram", "bigram", "3-gram", "bayes"}
    for b in range(4):  # add-one counts of what followed the same min(h, 2) tokens, at positions with as many
        x = tokens[b].view(2, 6).tolist()
        for h in range(6):
            seen = [(0, g) for g in range(6)] + [(1, g) for g in range(h)]
            counts = np.ones(2)
            for l, g in seen:
                if min(g, 2) == min(h, 2) and all(x[l][g - j] == x[1][h - j] for j in range(1, min(h, 2) + 1)):
                    counts[x[l][g]] += 1
            np.testing.assert_allclose(got["3-gram"][b, h].exp().numpy(), counts / counts.sum(), rtol=1e-12)
    ours = MarkovTreeTask.random(4, 2, 5, seed=1)
    got = strategies(ours, ours.sample(3)[0])
    mu = got["stationary"][0, 0].exp()
    torch.testing.assert_close(mu @ ours.pi, mu)
    torch.testing.assert_close(mu, stationary(ours.pi))
    assert abs(mu.sum().item() - 1) < 1e-12


def test_distances_zero_at_the_reference_and_nll_gap_matches_target_nll():
    task = make_task("chain:kernel=dirichlet", 3, 1, 6)
    tokens, _ = task.sample(64, torch.Generator().manual_seed(0))
    ref = strategies(task, tokens)
    model = ref["unigram"]
    kl = distances(model, ref, tokens, "kl")
    assert kl["unigram"].abs().max() < 1e-12 and (kl["bayes"][1:] > 0).all()
    gap = distances(model, ref, tokens, "nll_gap")
    assert gap["bayes"][1:].mean().item() == pytest.approx(target_nll(model, tokens) - target_nll(ref["bayes"], tokens))
    with pytest.raises(ValueError, match="distance kind"):
        distances(model, ref, tokens, "tv")


# Samplers ------------------------------------------------------------------------------------------------
def test_chain_transitions_follow_the_drawn_kernel():
    """Given the per-context kernels, the empirical transitions of each context match them (chi-square)."""
    task = make_task("chain:kernel=dirichlet", 3, 40, 50, alpha=1.0)
    g = torch.Generator().manual_seed(11)
    kernels = task.sample_kernels(4, g)
    tokens, parents = task.sample(4, g, kernels=kernels)
    assert parents.shape == (4, 50) and parents[0, 0] == -1 and (parents[:, 1:] == torch.arange(49)).all()
    x = tokens.view(4, 41, 50)
    for b in range(4):
        pairs = torch.zeros(3, 3)
        np.add.at(pairs.numpy(), (x[b, :, :-1].flatten().numpy(), x[b, :, 1:].flatten().numpy()), 1)
        expected = pairs.sum(1, keepdim=True) * kernels[1][b].float()
        chi2 = ((pairs - expected) ** 2 / expected).sum().item()
        assert chi2 < 30  # 6 degrees of freedom: P(chi2 > 30) < 1e-4


def test_dirichlet_kernels_have_dirichlet_moments_and_multi_parent_tables_their_rows():
    task = make_task("random_dag:parents=2:seed=3:kernel=dirichlet", 3, 1, 6, alpha=0.5)
    assert task.parents[1] == [0] and all(len(p) == 2 for p in task.parents[2:])
    rows = task.sample_kernels(4000, torch.Generator().manual_seed(0))[2].reshape(-1, 3)  # 36000 rows
    mean, var = rows.mean(0), rows.var(0)
    se_mean = (var / len(rows)).sqrt()
    assert ((mean - 1 / 3).abs() < 5 * se_mean).all()
    exact_var = (1 / 3) * (2 / 3) / (3 * 0.5 + 1)
    assert ((var - exact_var).abs() < 0.01).all()
    # fixed tables: P(x_2 | x_0, x_1) is the table's row
    fixed = make_task("given:parents=[[],[0],[0,1]]", 2, 0, 3, alpha=1.0, task_seed=2)
    tokens, parents = fixed.sample(40000, torch.Generator().manual_seed(1))
    assert parents.shape == (40000, 3, 2)
    x = tokens.view(-1, 3)
    for a, c in itertools.product(range(2), range(2)):
        sel = (x[:, 0] == a) & (x[:, 1] == c)
        freq = (x[sel, 2] == 1).double().mean().item()
        p = fixed.tables[2][2 * a + c, 1].item()
        assert abs(freq - p) < 5 * math.sqrt(p * (1 - p) / sel.sum().item())


# Our task, bit for bit --------------------------------------------------------------------------------
def test_our_task_is_unchanged_and_the_family_sampler_draws_as_ours():
    for cfg, saved in (
        (TrainConfig(), json.loads((ROOT / "models/checkpoints/default/config.json").read_text())["task"]),
        (StandardConfig(), json.loads((ROOT / "models/checkpoints/standard/task.json").read_text())),
    ):
        task, mine = cfg.task(), cfg.task().to_dict()
        assert type(task) is MarkovTreeTask  # the shipped checkpoints' tasks; their layout the legacy string
        assert {k: v for k, v in mine.items() if k != "layout"} == {k: v for k, v in saved.items() if k != "layout"}
        layouts = [Layout.from_json(x["layout"], task.n_examples, task.seq_len, task.d_vocab) for x in (mine, saved)]
        assert layouts[0] == layouts[1] == Layout(task.n_examples, task.seq_len, task.d_vocab)
    ours = MarkovTreeTask.random(4, 3, 7, alpha=0.5, gamma=0.1, seed=9)
    assert make_task("random_tree", 4, 3, 7, 0.5, 0.1, 9).to_dict() == ours.to_dict()
    tree = ours.sample_parents(1, torch.Generator().manual_seed(4))[0]
    family = GraphTask(4, 3, 7, "given", "fixed", [[] if p < 0 else [p] for p in tree.tolist()], {1: ours.pi})
    mine, mine_parents = family.sample(50, torch.Generator().manual_seed(8))
    theirs, _ = ours.sample(50, torch.Generator().manual_seed(8), parents=tree.expand(50, -1))
    assert torch.equal(mine, theirs) and torch.equal(mine_parents, tree.expand(50, -1))
    # a random tree per context: the trees are MarkovTreeTask's draws
    dirichlet = make_task("random_tree:kernel=dirichlet", 4, 3, 7)
    assert torch.equal(
        dirichlet.sample(20, torch.Generator().manual_seed(5))[1], ours.sample(20, torch.Generator().manual_seed(5))[1]
    )


def test_task_json_round_trip_and_old_files_read_as_ours():
    for spec in ("chain:kernel=dirichlet", "given:parents=[[],[0],[0,1],[1]]", "random_tree:kernel=dirichlet"):
        task = make_task(spec, 3, 0, 4, alpha=0.3)
        back, layout = read_task(json.loads(json.dumps(task.to_dict())), "task.json")
        assert back.to_dict() == task.to_dict() and layout.n_examples == 0
        g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
        assert torch.equal(back.sample(5, g1)[0], task.sample(5, g2)[0])
    old = {"pi": MarkovTreeTask.random(3, 2, 4).pi.tolist(), "n_examples": 2, "seq_len": 4}
    assert type(read_task(old, "task.json")[0]) is MarkovTreeTask


# Every task through both trainers, inspect and trajectory ------------------------------------------------
FAMILY = [  # (task kind, the disentangled model's L and K, the standard GPT-2's L): the peers' L = 0
    ("markov_tree", 2, None, 2),  # ours
    ("chain:kernel=dirichlet", 0, 1, 0),  # Edelman et al.'s in-context Markov chains
    ("ngram:n=3:kernel=dirichlet", 0, 2, 0),  # Chen et al.'s n-grams
    ("random_dag:parents=1:seed=0:kernel=dirichlet", 1, None, 0),  # Nichani et al.'s; relative positions need L >= 1
]


@pytest.mark.parametrize(("spec", "L", "K", "L_standard"), FAMILY)
def test_each_task_runs_through_both_trainers_inspect_and_trajectory(tmp_path, spec, L, K, L_standard):
    """A few steps of each trainer with snapshots, then analyses.inspect and analyses.trajectory on the run:
    the run records its task, inspect measures against that task's own Bayes oracle, trajectory reads
    every snapshot, and an n-gram's heads are scored on the n - 1 previous tokens."""
    from conftest import tiny_train_config

    from analyses import common, trajectory
    from analyses import inspect as inspect_analysis
    from models import load_task
    from models.training.standard import train_standard
    from models.training.train import train

    alpha = 0.5
    cfg = tiny_train_config(tmp_path, task_kind=spec, alpha=alpha, n_examples=L, n_copy_heads=K, seq_len=5,
                            steps=4, snapshot_every=2, eval_every=2, eval_contexts=16)  # fmt: skip
    train(cfg, progress=False)
    std = StandardConfig(task_kind=spec, alpha=alpha, d_vocab=3, n_examples=L_standard, seq_len=5, n_heads=2,
                         d_model=8, d_mlp=16, steps=4, batch_size=8, eval_every=2, eval_contexts=16, snapshot_every=2,
                         out=str(tmp_path / "std"))  # fmt: skip
    train_standard(std, progress=False)
    order = 2 if spec.startswith("ngram") else 1
    for run, made in ((tmp_path / "run", cfg), (tmp_path / "std", std)):
        task = load_task(run)
        assert task.to_dict() == made.task().to_dict()
        out = tmp_path / f"{run.name}-figures"
        inspect_analysis.main(["--checkpoint", str(run), "--n-contexts", "16", "--out", str(out)])
        r = json.loads((out / "inspect.json").read_text())["results"]
        tokens, _ = common.sample_contexts(task, 16, 0)
        assert r["nll_bma"] == pytest.approx(target_nll(bayes(task, tokens)[0], tokens), abs=1e-12)
        assert all(("previous_2" in h["sequence"]) == (order == 2) for h in r["heads"])
        trajectory.main(["--checkpoint", str(run), "--n-contexts", "16", "--out", str(out)])
        t = json.loads((out / "trajectory.json").read_text())["results"]
        assert [s["step"] for s in t["snapshots"]] == [2, 4] and len(t["closest"]) == 2
        assert all(("previous_2" in layer) == (order == 2) for s in t["snapshots"] for layer in s["layers"])


def test_the_disentangled_model_refuses_a_graph_it_cannot_read_without_demonstrations(tmp_path, capsys):
    """Relative positions only: with L = 0 a random DAG's parents sit at offsets that change with the
    position (a chain's and an n-gram's do not); one line, exit 2, nothing written."""
    from models.training.train import main

    assert relative_offsets([[], [0], [1], [2]]) == [1]
    assert relative_offsets([[], [0], [0, 1], [1, 2]]) == [1, 2]  # a 3-gram
    assert relative_offsets([[], [0], [0], [2]]) is None and relative_offsets(None) is None
    assert relative_offsets([[], [], [1]]) is None  # position 1 lacks the parent at offset 1
    spec = "random_dag:parents=1:seed=0:kernel=dirichlet"
    assert relative_offsets(make_task(spec, 3, 0, 6).parents) is None
    for kind in (spec, "random_tree:kernel=dirichlet", "given:parents=[[],[0],[0],[2],[3],[4]]"):
        with pytest.raises(SystemExit) as e:
            main(["--task-kind", kind, "--n-examples", "0", "--n-copy-heads", "2", "--seq-len", "6",
                  "--out", str(tmp_path / "out")])  # fmt: skip
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "reads relative positions only" in err[0] and "models.standard" in err[0], err
    assert not (tmp_path / "out").exists()
    TrainConfig(task_kind=spec, n_examples=1)  # with demonstrations it builds
    TrainConfig(task_kind="ngram:n=3:kernel=dirichlet", n_examples=0, n_copy_heads=2)


# Bad input ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("module", "args", "message"),
    [
        ("models.train", ["--task-kind", "tree"], "'tree' is unknown"),
        ("models.standard", ["--task-kind", "chain:kernel=random"], "kernel='random'; expected fixed or dirichlet"),
        ("models.standard", ["--task-kind", "dag"], "'dag' is unknown"),
        ("models.train", ["--task-kind", "markov_tree:n=3"], "markov_tree takes no options"),
        ("models.train", ["--task-kind", "given:parents=[[1],[0],[0],[1]]"], "not a DAG"),
        ("models.standard", ["--task-kind", "given:parents=[[],[2],[0],[1]]"], "not a DAG"),
        (
            "models.train",
            ["--task-kind", "chain:kernel=dirichlet", "--alpha", "0"],
            "--alpha must be a finite number in (0, ",
        ),
        ("models.standard", ["--task-kind", "chain:kernel=dirichlet", "--alpha", "-0.5"], "--alpha must be"),
    ],
)
def test_bad_task_input_is_one_line_and_exit_2(tmp_path, module, args, message):
    run = forked.run(  # python -m, the imports done once (tests/helpers/forked.py)
        module, *args, "--seq-len", "4", "--out", str(tmp_path / "out"),
        cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and ("--task-kind" in lines[0] or "--alpha" in lines[0])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("parents", [[], [2], [0]], "not a DAG"), ("alpha", 0.0, "alpha must be a finite number > 0"),
     ("graph", "tree", "task graph 'tree' is unknown")],
)  # fmt: skip
def test_a_bad_task_json_is_one_line_and_exit_2_in_an_analysis(tmp_path, capsys, field, value, message):
    """The same bad input read from a checkpoint's task.json: analyses.inspect and analyses.trajectory say so in
    one line and exit 2."""
    from analyses import inspect as inspect_analysis
    from analyses import trajectory
    from models.training.standard import train_standard

    std = StandardConfig(task_kind="chain:kernel=dirichlet", d_vocab=3, n_examples=0, seq_len=3, n_heads=1, d_model=8,
                         d_mlp=8, steps=2, batch_size=4, eval_every=2, eval_contexts=8, snapshot_every=2,
                         out=str(tmp_path / "std"))  # fmt: skip
    train_standard(std, progress=False)
    task_json = tmp_path / "std" / "task.json"
    task_json.write_text(json.dumps({**json.loads(task_json.read_text()), field: value}))
    for main in (inspect_analysis.main, trajectory.main):
        with pytest.raises(SystemExit) as e:
            main(["--checkpoint", str(tmp_path / "std"), "--n-contexts", "8", "--out", str(tmp_path / "figs")])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "figs").exists()


def test_graph_task_rejects_bad_fields():
    with pytest.raises(ValueError, match="alpha must be a finite number > 0"):
        GraphTask(3, 1, 4, "chain", "dirichlet", [[], [0], [1], [2]], alpha=0.0)
    with pytest.raises(ValueError, match="is our task: kind markov_tree"):
        GraphTask(3, 1, 4, "random_tree", "fixed")
    with pytest.raises(ValueError, match="tables for parent counts"):
        GraphTask(3, 1, 4, "chain", "fixed", [[], [0], [1], [2]])


# One sequence per context (L = 0), the peers' setting ---------------------------------------------------
def test_no_demonstrations_the_copyers_read_the_target_prefix():
    """With L = 0 the copyers attend inside the target's own prefix (w_L[k, 0]); row 0, with no key, copies
    nothing; a copyer preferring offset -1 is a previous-token head; the loss and its gradient are finite."""
    from models.nets.causal_transformer import CausalTransformer, CausalTransformerConfig

    with pytest.raises(ValueError, match="n_copy_heads must be given"):
        CausalTransformerConfig(3, 0, 6)
    model = CausalTransformer(CausalTransformerConfig(3, 0, 6, n_copy_heads=2, dtype="float64"))
    with torch.no_grad():
        model.blocks[0].attn.w_H[0, 6 - 2] = 50.0  # offset h' - h = -1
    tokens = make_task("chain:kernel=dirichlet", 3, 0, 6).sample(4)[0]
    _, cache = model.run_with_cache(tokens)
    z = cache["blocks.0.attn.hook_z"]  # [batch, H, K, d]
    assert torch.equal(z[:, 0], torch.zeros_like(z[:, 0]))
    previous = torch.nn.functional.one_hot(tokens[:, :-1], 3).double()
    torch.testing.assert_close(z[:, 1:, 0], previous, atol=1e-12, rtol=0)
    loss = model(tokens, return_type="loss")
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())
    with pytest.raises(ValueError, match="n_copy_heads must be given"):
        TrainConfig(n_examples=0, task_kind="chain:kernel=dirichlet")
    with pytest.raises(ValueError, match="n_examples must be >= 1 for the task markov_tree"):
        TrainConfig(n_examples=0, n_copy_heads=2)  # ours needs a demonstration
    with pytest.raises(ValueError, match="n_examples must be in"):
        TrainConfig(n_examples=0, n_copy_heads=2, task_kind="random_tree")  # ours, by its family name


def test_no_demonstrations_init_gives_each_copyer_its_own_offset():
    """Without demonstrations to spread the heads over, head k starts at offset -(k+1): distinct heads."""
    from models.nets.causal_transformer import CausalTransformer, CausalTransformerConfig
    from models.training.train import init_copyers

    model = CausalTransformer(CausalTransformerConfig(3, 0, 6, n_copy_heads=3))
    assert init_copyers(model, 1.0, 5.0, torch.Generator().manual_seed(0)) == [-1, -1, -1]
    pattern = model.copyer_pattern().detach()  # [K, H, H]
    h = 5
    assert pattern[:, h].argmax(-1).tolist() == [h - 1, h - 2, h - 3]


def test_counting_in_chunks_changes_nothing(monkeypatch):
    import probes.oracles

    task = make_task("ngram:n=3:kernel=dirichlet", 3, 2, 8)
    tokens, _ = task.sample(40, torch.Generator().manual_seed(0))
    whole = bayes(task, tokens)[0]
    monkeypatch.setattr(probes.oracles, "CHUNK_ENTRIES", 1000)  # 1 context a chunk
    assert torch.equal(bayes(task, tokens)[0], whole)
    with pytest.raises(ValueError, match="bound is"):
        make_task("chain:kernel=dirichlet", 4096, 1, 4).sample(16)


# Our task unchanged -------------------------------------------------------------------------------------
def test_the_shipped_checkpoints_and_our_numbers_are_unchanged():
    """Our task's committed numbers, made before the family existed, recomputed through the family's entry
    points (the trainers' ``task()``, ``probes.oracles.bayes``): ``figures/head_ablation.json`` on the shipped
    checkpoint (its 2048 contexts: the model's NLL, BMA's, the parent selector's TV to BMA, parent accuracy)
    and the shipped GPT-2's last evaluation in its training.json (its 512 held-out contexts: NLL, BMA, the
    plateau). A changed checkpoint, sampler or oracle moves them."""
    from models import load
    from models.training.standard import reference_nlls, target_log_probs
    from probes import mean_tv
    from probes.metrics import parent_set_accuracy

    committed = json.loads((ROOT / "figures/head_ablation.json").read_text())
    task = TrainConfig().task()
    tokens, parents = task.sample(committed["n_contexts"], torch.Generator().manual_seed(committed["seed"]))
    with torch.no_grad():
        log_probs, cache = load("default").run_with_cache(tokens, names_filter="blocks.1.attn.hook_pattern")
    predictive, posterior = bayes(task, tokens)
    selector = cache["blocks.1.attn.hook_pattern"][:, 0].double()
    intact, bma = committed["results"]["intact"], committed["results"]["bma"]
    assert target_nll(predictive, tokens) == pytest.approx(bma["nll"], abs=1e-12)
    assert parent_set_accuracy(posterior, parents) == pytest.approx(bma["parent_acc"], abs=1e-12)
    assert target_nll(log_probs, tokens) == pytest.approx(intact["nll"], abs=1e-6)  # float32 forward: thread order
    assert mean_tv(selector, posterior) == pytest.approx(intact["tv"], abs=1e-6)
    assert parent_set_accuracy(selector, parents) == intact["parent_acc"]

    training = json.loads((ROOT / "models/checkpoints/standard/training.json").read_text())
    cfg, last = StandardConfig(), training["history"][-1]
    task = cfg.task()
    tokens, _ = task.sample(cfg.eval_contexts, torch.Generator().manual_seed(cfg.seed + 1_000_003))  # its eval draw
    with torch.no_grad():
        nll = target_nll(target_log_probs(load("standard"), tokens, task), tokens)
    ref = reference_nlls(task, tokens)
    assert (ref["nll_bma"], ref["nll_uniform"]) == pytest.approx((last["nll_bma"], last["nll_uniform"]), abs=1e-12)
    assert nll == pytest.approx(last["nll"], abs=1e-6)
