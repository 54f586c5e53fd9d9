"""Every number the README states, read back from the JSON it came from (issue 19).

CLAIMS: (README phrase with ``{...}`` format fields, source file, function of the parsed JSON returning the
values). The test formats the values with the README's own rounding and asserts the phrase occurs in
README.md or a page under docs/ (whitespace-normalised: a section may move from the README to the docs
site), so a stale number fails naming the claim, the text found and the JSON's value. UNCHECKED lists the numbers that come from no committed JSON, with the reason.
A second test checks that every relative link and image in README.md, figures/README.md and every page under
docs/ (the docs site's pages written by hand: tutorials, how-to, reference, explanation, results) resolves to a
file inside the repository; tests/test_docs.py builds the site with --strict, which checks the generated pages.
"""

import functools
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

HA = "figures/head_ablation.json"
DEFAULT_CFG = "models/checkpoints/default/config.json"
STANDARD_TRAINING = "models/checkpoints/standard/training.json"
SCALE = "figures/scale.json"
PHASE = "figures/phase_diagram.json"
MEDIUM = "medium: float32, 1500 steps (--preset medium until 2026-12-02)"
LARGE = "large: float32, 3000 steps (--preset large until 2026-12-02)"
LARGE_X1 = "large: scale init, copyer lr x1, 400-step schedule (stopped)"
LARGE_X01 = "large: float32, 3000 steps, copyer lr x0.1 (the old preset with --copyer-lr-scale 0.1)"
REFERENCE = "reference recipe, lr 3e-2 const, init_demo 3 (stopped)"
MEDIUM_X1 = "scale init, copyer lr x1"
MEDIUM_NOW = "medium: --preset medium (bfloat16 autocast, 1200 steps)"
LARGE_NOW = "large: --preset large (bfloat16 autocast, 2200 steps)"
LARGE_SEED1 = "large: --preset large, --seed 1 (2026-12-03)"


def _last(d):
    return d["training"]["history"][-1]


def _at(run, step, key):
    """One value of a scale.json run's history at ``step``."""
    return run[key][run["step"].index(step)]


def _cell(d, family, alpha, L=6, loss="all", key="mean_progress"):
    """One phase-diagram cell's value (by default as the figure prints it: the mean final progress over its
    seeds); the disentangled model's loss is on the target tokens."""
    loss = "target" if family == "disentangled" else loss
    (cell,) = [c for c in d["results"]["cells"] if (c["family"], c["alpha"], c["L"], c["loss_on"]) == (family, alpha, L, loss)]
    return cell[key]


def _cells(d, key="mean_progress", **match):
    """Every phase-diagram cell's ``key`` among the cells whose fields equal ``match``."""
    return [c[key] for c in d["results"]["cells"] if all(c[k] == v for k, v in match.items())]


def _first_within(run, gap=0.01, tv=0.05):
    """The first evaluated step of a scale.json run within the targets."""
    return next(s for s, g, t in zip(run["step"], run["nll_gap"], run["tv_to_bma"]) if g <= gap and t <= tv)


def _within_at(run):
    """(gap, TV) at that step."""
    i = run["step"].index(_first_within(run))
    return run["nll_gap"][i], run["tv_to_bma"][i]


def _head(d, label):
    (head,) = [h for h in d["results"]["heads"] if h["label"] == label]
    return head


def _history_at(d, step):
    (row,) = [r for r in d["history"] if r["step"] == step]
    return row


def _r(name):
    """The ``results`` of one committed figure JSON (for the claims that read two files)."""
    return _load(f"figures/{name}.json")["results"]


def _struct(d, key, n, field):
    """cape_structure.json: one structure-learning metric at N samples."""
    (row,) = [r for r in d["results"]["structure"][key] if r["N"] == n]
    return row[field]


def _bma_at(d, kind, L):
    (row,) = [r for r in d["results"]["bma"][kind] if r["L"] == L]
    return row["parent_accuracy"]


def _pair_acc(d, hook):
    """Mean pair-probe accuracy over every (h, h') cell the probe was fitted on."""
    accs = [a for row in d["results"]["pair_probes"][hook]["test_acc"] for a in row if a is not None]
    return sum(accs) / len(accs)


def _role_range(d, layer, role, queries=(0, 1)):
    """standard_circuit.json: (min, max) of one role-profile mass over a layer's heads, the query kinds
    (0 demonstration, 1 target) pooled."""
    masses = [h[role][q] for h in d["results"]["heads"] if h["layer"] == layer for q in queries]
    return min(masses), max(masses)


def _first_step(d, fraction):
    """First training step of init_gradient's W_KQ-only run at ``fraction`` of BMA's parent accuracy."""
    t = d["results"]["training"]
    return next(s for s, a in zip(t["step"], t["parent_acc"]) if a >= fraction * t["bma_parent_acc"])


def _sci(x):
    """The README's short scientific notation: 3.4e-3, 2e-16."""
    mantissa, exponent = f"{x:.1e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def _into(d, receivers, inp, group):
    """circuit.json: one input's summed edge score and its standard error (``by_input``)."""
    (row,) = [r for r in d["results"]["by_input"] if (r["receivers"], r["input"], r["group"]) == (receivers, inp, group)]
    return row["sum"], row["se"]


def _edge(d, sender, receiver, inp="in", group="target"):
    """circuit.json: one edge's score and its standard error."""
    want = {"sender": sender, "receiver": receiver, "input": inp, "group": group}
    (e,) = [e for e in d["results"]["all_edges"] if all(e[k] == v for k, v in want.items())]
    return e["score"], e["se"]


def _kept_into(d, prefix, inp):
    """circuit.json: how many of the circuit's edges enter input ``inp`` of the nodes whose names start with ``prefix``."""
    return sum(e["receiver"].startswith(prefix) and e["input"] == inp for e in d["results"]["edges"])


def _circuit(d):
    """circuit.json: progress, kept / total edges and their share, faithfulness and KL with their errors."""
    r = d["results"]
    n = len(r["edges"])
    return (r["progress"], r["progress_se"], n, r["n_edges_total"], n / r["n_edges_total"], r["faithfulness"],
            r["faithfulness_se"], r["kl_to_full"], r["kl_to_full_se"])


def _answers(d, where="held_out"):
    """circuit.json: on one sample, its size, the faithfulness under each corruption and the sufficiencies."""
    m = d["results"][where]
    return (m["n_contexts"], m["faithfulness_demonstrations"], m["faithfulness_demonstrations_se"],
            m["faithfulness_mean"], m["faithfulness_mean_se"], m["sufficiency_mean"], m["sufficiency_mean_se"],
            m["sufficiency_resample"], m["sufficiency_resample_se"])  # fmt: skip


def _shape(d):
    """circuit.json: held-out progress, the circuit's nodes (of all heads and MLPs) and edges."""
    r = d["results"]
    return (r["held_out"]["progress"], r["held_out"]["progress_se"], len(r["nodes"]), len(r["node_costs"]),
            ", ".join(r["nodes"]), len(r["edges"]), r["n_edges_total"])  # fmt: skip


def _searches(d):
    """circuit.json: per corruption, the edges kept, their faithfulness on the search contexts, and how many
    are within 2 standard errors of zero."""
    s = d["results"]["searches"]
    return tuple(x for c in ("demonstrations", "mean") for x in
                 (len(s[c]["edges"]), s[c]["faithfulness"], s[c]["faithfulness_se"], s[c]["n_within_2se"]))  # fmt: skip


def _costs(d, names):
    """circuit.json: each named node's mean-ablation cost alone and its standard error."""
    c = d["results"]["node_costs"]
    return tuple(x for n in names for x in (c[n]["cost"], c[n]["se"]))


def _sci0(x):
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


AP = "figures/activation_patching.json"
SC = "figures/standard_circuit.json"
CIRCUIT = "figures/circuit.json"
SEED1 = "docs/reproductions/circuit_seed1.json"
SEED2 = "docs/reproductions/circuit_seed2_w96.json"
CD = "figures/cape_downstream.json"
CS = "figures/cape_structure.json"

TJ, REPRO = "figures/trajectory.json", "docs/reproductions/"


def _phase(d, i):
    phase = d["results"]["phases"][i]
    return phase["start"], phase["end"]


def _seq(d, label, key):
    return _head(d, label)["sequence"][key]


def _bench(d, row, ours_unit, baseline_unit):
    """(ours, baseline, ratio) of the one bench row whose name holds ``row``, in the README's units."""
    (r,) = [r for r in d["rows"] if row in r["row"]]
    return r["ours_s"] * ours_unit, r["baseline_s"] * baseline_unit, r["ratio"]


def _gap(d):
    return d["results"]["nll"] - d["results"]["nll_bma"]


CATFORMER = REPRO + "nichani_dags_catformer.json"


def _sweep(d, i=None, key="parent_attention"):
    """nichani_dags' first sweep; with ``i``, its i-th DAG's ``key``."""
    s = d["results"]["sweeps"][0]
    return s if i is None else s["runs"][i][key]


def _at_step(d, step, i=0):
    """nichani_dags' i-th DAG's measure at ``step`` of its training history."""
    return {h["step"]: h["parent_attention"] for h in _sweep(d)["runs"][i]["history"]}[step]


def _per_dag(d):
    from analyses.nichani_dags import THEIRS_PER_DAG

    return [x for r in _sweep(d)["runs"] for x in (r["parent_attention"], THEIRS_PER_DAG[r["index"]])]


TRAJECTORY_CLAIMS = [
    ("the CatFormer's attention on the parent {:.3f} +- {:.3f} (sd) over their 20 DAGs, SE {:.3f}, beside their 0.837 "
     "+- 0.054; DAG by DAG, ours minus theirs {:+.3f} +- {:.3f} (SE)", CATFORMER,
     lambda d: (_sweep(d)["mean"], _sweep(d)["std"], _sweep(d)["se"], _sweep(d)["minus_theirs"]["mean"],
                _sweep(d)["minus_theirs"]["se"])),
    ("Per DAG (theirs in brackets): " + ", ".join(f"{i}: {{:.3f}} ({{:.3f}})" for i in range(20)), CATFORMER, _per_dag),
    ("Each DAG took {:.0f} to {:.0f} s of CPU (mean {:.0f} s) and {:.0f} to {:.0f} s of wall time, {:.0f} min for the 20",
     CATFORMER, lambda d: (min(r["cpu_seconds"] for r in _sweep(d)["runs"]), max(r["cpu_seconds"] for r in _sweep(d)["runs"]),
                           sum(r["cpu_seconds"] for r in _sweep(d)["runs"]) / 20, min(r["seconds"] for r in _sweep(d)["runs"]),
                           max(r["seconds"] for r in _sweep(d)["runs"]), sum(r["seconds"] for r in _sweep(d)["runs"]) / 60)),
    ("their measure after 16384 steps was {:.3f} with their batch of 1024", REPRO + "nichani_dags_catformer_b1024.json",
     lambda d: (_sweep(d, 0),)),
    ("{:.3f} with 256 and", REPRO + "nichani_dags_catformer_b256.json", lambda d: (_sweep(d, 0),)),
    ("(DAG 1: {:.3f} with 256,", REPRO + "nichani_dags_catformer_b256.json", lambda d: (_sweep(d, 1),)),
    ("{:.3f} with 128 (DAG 1:", CATFORMER, lambda d: (_sweep(d, 0),)),
    ("with 256, {:.3f} with 128;", CATFORMER, lambda d: (_sweep(d, 1),)),
    ("at step 8192, {:.3f} with 1024", REPRO + "nichani_dags_catformer_b1024.json", lambda d: (_at_step(d, 8192),)),
    ("and {:.3f} with 128 (each run's JSON", CATFORMER, lambda d: (_at_step(d, 8192),)),
    ("layer 0's attention on the parent {:.3f} +- {:.3f} over those {} DAGs", REPRO + "nichani_dags.json",
     lambda d: (d["results"]["mean"], d["results"]["std"], d["results"]["n_dags"])),
    ("closest to the stationary distribution (steps {}-{}), then to the uniform-parent plateau ({}), then to Bayes "
     "({}-{}), the switches at steps {:.0f} and {:.0f} (KL crossings), each with the loss falling {:.1f}x faster "
     "than the median rate; at step 200 the progress is {:.2f}", TJ,
     lambda d: (*_phase(d, 0), _phase(d, 1)[0], *_phase(d, 2), *(s["crossing"] for s in d["results"]["switches"]),
                d["results"]["switches"][0]["sharpness"], d["results"]["snapshots"][-1]["progress"])),
    ("uniform (step {}) -> unigram ({}-{}) -> bigram = Bayes ({}-{}); KL crossings at steps {:.0f} and {:.0f}, the "
     "second with the loss falling {:.1f}x the median rate ({:.3f} -> {:.3f} nats; uniform {:.3f}, unigram {:.3f}, "
     "Bayes {:.3f})", REPRO + "icl_mc_trajectory.json",
     lambda d: (_phase(d, 0)[0], *_phase(d, 1), *_phase(d, 2), *(s["crossing"] for s in d["results"]["switches"]),
                d["results"]["switches"][1]["sharpness"], d["results"]["switches"][1]["loss_before"],
                d["results"]["switches"][1]["loss_after"], *d["results"]["strategies"].values())),
    ("names L0H0 a previous-token head (mass {:.2f}) and L1H0 an induction head ({:.2f}, chance {:.2f}); progress "
     "{:.2f}", REPRO + "icl_mc_inspect.json",
     lambda d: (_seq(d, "L0H0", "previous_token"), _seq(d, "L1H0", "induction"), _seq(d, "L1H0", "induction_chance"),
                d["results"]["progress"])),
    ("with one head a layer L0H0's attention (content included) puts {:.2f} on its own token's parent (uniform attention: {:.2f}), progress {:.2f}",
     REPRO + "nichani_dag_1head_inspect.json",
     lambda d: (_seq(d, "L0H0", "own_parent"), _seq(d, "L0H0", "own_parent_chance"), d["results"]["progress"])),
    ("with two heads (progress {:.2f}) at most {:.2f} ({}), and the parent head that forms, L0H1, reads the parent "
     "of the token it predicts instead ({:.2f} of its mass, argmax on it {:.2f} of the time)",
     REPRO + "nichani_dag_2heads_inspect.json",
     lambda d: (d["results"]["progress"], *max((h["sequence"]["own_parent"], h["label"]) for h in d["results"]["heads"]),
                _head(d, "L0H1")["role_profile"]["parent"][1], _head(d, "L0H1")["parent_acc"])),
    ("a step {:.0f} ms against {:.2f} s ({:.1f}x), the time to the targets {:.0f} s against {:.0f} s ({:.1f}x), a "
     "batch drawn {:.1f} ms on one thread against {:.1f} ms on two ({:.1f}x); the freed memory kept alone, a step "
     "{:.0f} ms against {:.0f} ms ({:.2f}x)", REPRO + "bench_large_2026-12-03.json",
     lambda d: (*_bench(d, "a training step (", 1e3, 1), *_bench(d, "time to the targets", 1, 1),
                *_bench(d, "drawing a training batch", 1e3, 1e3), *_bench(d, "the freed memory kept", 1e3, 1e3))),
    ("| `analyses.inspect`, default flags, one thread | {:.0f} s wall, {:.0f} s CPU, peak RSS {:.2f} GB | {:.0f} s wall, "
     "{:.0f} s CPU, peak RSS {:.2f} GB | {:.1f}x the wall time, {:.1f}x the CPU time |", REPRO + "bench_scale_2026-12-04.json",
     lambda d: (*(d["rows"][0]["runs"][m][k] / (2**30 if k == "peak_rss" else 1) for m in ("big", "shipped")
                  for k in ("wall_s", "cpu_s", "peak_rss")), d["rows"][0]["ratio"],
                d["rows"][0]["runs"]["big"]["cpu_s"] / d["rows"][0]["runs"]["shipped"]["cpu_s"])),
    ("load average {:.1f} at the start of the GPT-2's run and {:.1f} at its end", REPRO + "bench_scale_2026-12-04.json",
     lambda d: tuple(d["rows"][0]["runs"]["big"]["load"])),
    ("L0H0's attention (content included) puts {:.2f} on its own token's parent (uniform attention: {:.2f}), L1H0 "
     "{:.2f}", REPRO + "nichani_dag_last_token_inspect.json",
     lambda d: (_seq(d, "L0H0", "own_parent"), _seq(d, "L0H0", "own_parent_chance"), _seq(d, "L1H0", "own_parent"))),
    ("its NLL is {:.4f} nats against Bayes' {:.4f} ({} held-out contexts", REPRO + "nichani_dag_last_token_training.json",
     lambda d: (d["history"][-1]["last_nll"], d["history"][-1]["last_nll_bma"], d["config"]["eval_contexts"])),
    ("on every other position it was never trained: progress {:.2f}", REPRO + "nichani_dag_last_token_inspect.json",
     lambda d: (d["results"]["progress"],)),
    ("An earlier attempt with Dirichlet(1) rows and a parent at every position, one head a layer: {:.2f} to {:.2f}",
     REPRO + "random_dag_inspect.json",
     lambda d: (min(h["sequence"]["own_parent"] for h in d["results"]["heads"]),
                max(h["sequence"]["own_parent"] for h in d["results"]["heads"]))),
    ("L0H1 puts {:.2f} on the previous token, L0H0 {:.2f} on the one before, L1H0 and L1H1 {:.2f} and {:.2f} on the "
     "generalized induction keys (chance {:.2f}); progress {:.2f}, {:.4f} nats above Bayes",
     REPRO + "ngram_gpt2_inspect.json",
     lambda d: (_seq(d, "L0H1", "previous_token"), _seq(d, "L0H0", "previous_2"), _seq(d, "L1H0", "induction"),
                _seq(d, "L1H1", "induction"), _seq(d, "L1H0", "induction_chance"), d["results"]["progress"], _gap(d))),
    ("phases bigram (step {}) -> Bayes ({}-{}), the switch at step {:.0f} with the loss falling {:.0f}x the median "
     "rate", REPRO + "ngram_gpt2_trajectory.json",
     lambda d: (_phase(d, 0)[0], *_phase(d, 1), d["results"]["switches"][0]["crossing"],
                d["results"]["switches"][0]["sharpness"])),
    ("{:.2f} and {:.2f} on the two parents (its copyers start at those offsets), L1H0 {:.2f} on the induction keys, "
     "but progress {:.2f}: {:.3f} nats above Bayes", REPRO + "ngram_disentangled_inspect.json",
     lambda d: (_seq(d, "L0H0", "previous_token"), _seq(d, "L0H1", "previous_2"), _seq(d, "L1H0", "induction"),
                d["results"]["progress"], _gap(d))),
    ("level with the add-one 3-gram ({:.3f} against {:.3f})", REPRO + "ngram_disentangled_trajectory.json",
     lambda d: (d["results"]["snapshots"][-1]["nll"], d["results"]["strategies"]["3-gram"])),
    ("its diagonal copy blocks have norms {:.1f} and {:.1f} on the parents' copies and {:.1f} on the third",
     REPRO + "ngram_disentangled_3heads_block_structure.json",
     lambda d: tuple(d["results"]["norms"][k][k] for k in (1, 2, 3))),
    ("whose head turns diffuse ({:.2f} on the previous token) and whose ablation costs {:.3f} nats against {:.2f} "
     "and {:.2f} for the parents'", REPRO + "ngram_disentangled_3heads_inspect.json",
     lambda d: (_seq(d, "L0H2", "previous_token"), _head(d, "L0H2")["ablation_dnll"],
                _head(d, "L0H0")["ablation_dnll"], _head(d, "L0H1")["ablation_dnll"])),
]

CLAIMS = [
    # Training and the shipped checkpoint: the default run's last eval (training history).
    ("ends at: NLL {:.4f} vs BMA {:.4f} (gap {:.4f} nats), mean TV to the BMA posterior {:.3f}, parent accuracy "
     "{:.3f} vs BMA's {:.3f}, ten heads copying ten distinct demonstrations with purity >= {:.3f}",
     DEFAULT_CFG, lambda d: (_last(d)["nll"], _last(d)["nll_bma"], _last(d)["nll_gap"], _last(d)["tv_to_bma"],
                             _last(d)["parent_acc"], _last(d)["parent_acc_bma"], min(_last(d)["head_purity"]))),
    ("The default (lr 1e-2, 3000 steps) keeps {:.2f}.", DEFAULT_CFG,
     lambda d: (min(_last(d)["head_purity"]),)),
    # Analyses: the paragraph before the table.
    ("shipped checkpoint `{}`", HA, lambda d: (d["checkpoint_hash"],)),
    # Analyses: the table rows.
    ("Intact TV to BMA {:.4f}.", HA, lambda d: (d["results"]["claims"]["intact_tv"],)),
    ("TV to BMA-without-its-demonstration {:.4f} on average (max {:.4f}) against {:.3f} to full BMA", HA,
     lambda d: tuple(d["results"]["claims"]["zero"][k] for k in ("mean_tv_without", "max_tv_without", "mean_tv_full"))),
    ("down to {:.3f} with none", HA, lambda d: (d["results"]["cumulative"][-1]["bma"]["parent_acc"],)),
    ("the query's token subspace changes nothing (max change {:.0f}", HA,
     lambda d: (d["results"]["controls"]["query_token_zero"]["max_abs_log_prob_change"],)),
    ("the key's token subspace moves the attention by TV {:.3f}", HA,
     lambda d: (d["results"]["controls"]["key_token_zero"]["tv_to_intact"],)),
    ("{} heads on {} distinct demonstrations", "figures/copyers.json",
     lambda d: (len(d["results"]["heads"]), d["results"]["distinct_demos"])),
    ("mass {:.3f} to {:.3f} on the demonstration, {:.2f} to {:.2f} on its same position", "figures/copyers.json",
     lambda d: (min(d["results"]["purity"]), max(d["results"]["purity"]),
                min(d["results"]["copy_purity"]), max(d["results"]["copy_purity"]))),
    ("On the shipped checkpoint: {:.3f} of the way from the uniform-parent plateau to BMA", "figures/inspect.json",
     lambda d: (d["results"]["progress"],)),
    ("{} credited as the parent-selecting head (accuracy {:.3f}, TV {:.3f})", "figures/inspect.json",
     lambda d: (d["results"]["parent_selecting"][0], _head(d, "L1H0")["parent_acc"], _head(d, "L1H0")["tv"])),
    # Key figures.
    ("stays near the intact {:.3f} while its TV to full BMA grows", HA, lambda d: (d["results"]["claims"]["intact_tv"],)),
    # Standard transformers: the standard checkpoint's training history.
    ("It reaches progress {:.2f} by step 1000", STANDARD_TRAINING, lambda d: (_history_at(d, 1000)["progress"],)),
    # Standard transformers: the committed full phase-diagram sweep, as figures/phase_diagram.json re-plots it.
    ("four kernels, the plateau {:.2f} to {:.2f} nats above BMA at L=6", PHASE,
     lambda d: (min(_cells(d, "plateau_gap", L=6)), max(_cells(d, "plateau_gap", L=6)))),
    ("disentangled model reaches {:.2f} to {:.2f} on every kernel and L, past 0.5 by step {} or {}", PHASE,
     lambda d: (min(_cells(d, family="disentangled")), max(_cells(d, family="disentangled")),
                *sorted({s for h in _cells(d, "steps_to_half", family="disentangled") for s in h}))),
    ("sharpest kernel: {:.2f} at L=3 and {:.2f} at L=6 (three seeds each: {:.2f}, {:.2f}, {:.2f} and {:.2f}, {:.2f}, "
     "{:.2f}), {:.2f} at L=12 with the all-token loss, but {:.2f} with the loss on the target tokens only", PHASE,
     lambda d: (_cell(d, "gpt2", 0.1, 3), _cell(d, "gpt2", 0.1, 6),
                *_cell(d, "gpt2", 0.1, 3, key="final_progress"), *_cell(d, "gpt2", 0.1, 6, key="final_progress"),
                _cell(d, "gpt2", 0.1, 12), _cell(d, "gpt2", 0.1, 6, "target"))),
    ("at L=3 and 6 ({:.2f} to {:.2f}); at L=12 it starts to leave on the Dir(0.3) kernel ({:.2f}, {:.2f}, {:.2f} over "
     "three seeds, still rising at step {}, none at 0.5) and not on the two flatter ones ({:.2f} and {:.2f})", PHASE,
     lambda d: (min(c for a in (1.0, 0.6, 0.3) for L in (3, 6) for c in _cells(d, family="gpt2", alpha=a, L=L)),
                max(c for a in (1.0, 0.6, 0.3) for L in (3, 6) for c in _cells(d, family="gpt2", alpha=a, L=L)),
                *_cell(d, "gpt2", 0.3, 12, key="final_progress"), d["results"]["grid"]["steps"],
                _cell(d, "gpt2", 0.6, 12), _cell(d, "gpt2", 1.0, 12))),
    ("plateau everywhere ({:.2f} to {:.2f})", PHASE,
     lambda d: (min(_cells(d, family="attn_only")), max(_cells(d, family="attn_only")))),
    ("with `--jobs {}` in {:.0f} s wall on the 2 cores shared with other jobs (load average {:.1f} at the start and "
     "{:.1f} at the end; the {} runs' own wall times sum to {:.0f} s)", PHASE,
     lambda d: (d["results"]["engine"]["jobs"], d["results"]["seconds"], *d["results"]["engine"]["load_average"],
                sum(len(c["runs"]) for c in d["results"]["cells"]),
                sum(r["seconds"] for c in d["results"]["cells"] for r in c["runs"]))),
    # Scale (figures/scale.json; the same runs as figures/scale_histories.json, checked below).
    ("at step 1000 the NLL gap to BMA is {:.4f} nats and the mean TV {:.3f}", SCALE,
     lambda d: (_at(d["results"][MEDIUM], 1000, "nll_gap"), _at(d["results"][MEDIUM], 1000, "tv_to_bma"))),
    ("least pure head {:.2f} at initialisation, {:.2f} after 300 steps, {}/{} distinct) and it stalls {:.2f} nats "
     "above BMA with TV {:.2f}", SCALE,
     lambda d: (d["results"][REFERENCE]["min_purity"][0], _at(d["results"][REFERENCE], 300, "min_purity"),
                d["results"][REFERENCE]["final"]["distinct_demos"], d["results"][REFERENCE]["final"]["n_heads"],
                d["results"][REFERENCE]["final"]["nll_gap"], d["results"][REFERENCE]["final"]["tv_to_bma"])),
    ("copies soften (least pure head {:.2f} to {:.2f} by step {}) for the same loss; at 0.3x purity stays at {:.2f}",
     SCALE, lambda d: (d["results"][MEDIUM_X1]["min_purity"][0], d["results"][MEDIUM_X1]["final"]["min_purity"],
                       d["results"][MEDIUM_X1]["final"]["step"], d["results"][MEDIUM]["final"]["min_purity"])),
    ("(gap {:.3f}, TV {:.2f} at step 500), then leaves it (gap {:.3f}, TV {:.3f} at step 1000), and ends at step {} "
     "with gap {:.4f} and TV {:.3f}", SCALE,
     lambda d: (_at(d["results"][LARGE], 500, "nll_gap"), _at(d["results"][LARGE], 500, "tv_to_bma"),
                _at(d["results"][LARGE], 1000, "nll_gap"), _at(d["results"][LARGE], 1000, "tv_to_bma"),
                d["results"][LARGE]["final"]["step"], d["results"][LARGE]["final"]["nll_gap"],
                d["results"][LARGE]["final"]["tv_to_bma"])),
    ("the least pure at {:.3f} (it falls from {:.3f} at initialisation", SCALE,
     lambda d: (d["results"][LARGE]["final"]["min_purity"], d["results"][LARGE]["min_purity"][0])),
    ("was stopped at step {} (gap {:.3f}, least pure head {:.2f} and falling)", SCALE,
     lambda d: (d["results"][LARGE_X1]["final"]["step"], d["results"][LARGE_X1]["final"]["nll_gap"],
                d["results"][LARGE_X1]["final"]["min_purity"])),
    ("(least pure head {:.3f})", SCALE, lambda d: (d["results"][LARGE_X01]["final"]["min_purity"],)),
    # The bfloat16 presets: their training histories (figures/scale.json) and models.evaluate on 4096 fresh contexts.
    ("within the targets from step {} (gap {:.4f}, TV {:.3f}, {} contexts); step {}: gap {:.4f}, TV {:.3f}", SCALE,
     lambda d: (_first_within(d["results"][MEDIUM_NOW]), *_within_at(d["results"][MEDIUM_NOW]),
                d["results"][MEDIUM_NOW]["eval_contexts"], d["results"][MEDIUM_NOW]["final"]["step"],
                d["results"][MEDIUM_NOW]["final"]["nll_gap"], d["results"][MEDIUM_NOW]["final"]["tv_to_bma"])),
    ("within the targets at step {} (gap {:.4f}, TV {:.3f}, {} contexts; {:.4f} at step 2000)", SCALE,
     lambda d: (_first_within(d["results"][LARGE_NOW]), *_within_at(d["results"][LARGE_NOW]),
                d["results"][LARGE_NOW]["eval_contexts"], _at(d["results"][LARGE_NOW], 2000, "nll_gap"))),
    *[(f"| {size} {{:.4f}} +- {{:.4f}} nats, TV {{:.3f}}, parent accuracy {{:.3f}} (BMA {{:.3f}}), {{}}/{{}} heads on "
       "distinct demonstrations, the least pure {:.3f} |", REPRO + f"scale_{name}_evaluate.json",
       lambda d: (d["nll_gap"], d["nll_gap_se"], d["tv_to_bma"], d["parent_acc"], d["parent_acc_bma"],
                  d["distinct_demos"], len(d["head_demo"]), min(d["head_purity"])))
      for name, size in (("medium", "gap"), ("large", "gap"))],
    ("is within the targets from step {} (gap {:.4f}, TV {:.3f}) and at step {} (gap {:.4f}, TV {:.3f} on its {} "
     "held-out contexts)", SCALE,
     lambda d: (_first_within(d["results"][LARGE_SEED1]), *_within_at(d["results"][LARGE_SEED1]),
                d["results"][LARGE_SEED1]["final"]["step"], d["results"][LARGE_SEED1]["final"]["nll_gap"],
                d["results"][LARGE_SEED1]["final"]["tv_to_bma"], d["results"][LARGE_SEED1]["eval_contexts"])),
    ("`python -m models.evaluate` on it: gap {:.4f} +- {:.4f} nats, TV {:.3f}, parent accuracy {:.3f} (BMA {:.3f}), "
     "{}/{} heads on distinct demonstrations, the least pure {:.3f}", REPRO + "scale_large_seed1_evaluate.json",
     lambda d: (d["nll_gap"], d["nll_gap_se"], d["tv_to_bma"], d["parent_acc"], d["parent_acc_bma"],
                d["distinct_demos"], len(d["head_demo"]), min(d["head_purity"]))),
    # Analyses table: activation_patching.
    ("Patching all copyer heads restores {:.6f} on both metrics; nothing gives {:.0f}.", AP,
     lambda d: (min(d["results"]["all_heads"]), max(d["results"]["nothing"]))),
    ("One head restores {:.2f} to {:.2f} of the clean token's log-prob but only ~{:.2f} of the parent attention "
     "(sum {:.2f}: not additive)", AP,
     lambda d: (min(d["results"]["heads_all_positions"][0]), max(d["results"]["heads_all_positions"][0]),
                sum(d["results"]["heads_all_positions"][1]) / len(d["results"]["heads_all_positions"][1]),
                sum(d["results"]["heads_all_positions"][1]))),
    ("The query side alone restores {:.3f} of the parent attention, the key side {:.3f}, both together {:.3f}", AP,
     lambda d: (d["results"]["query_all"][1], d["results"]["key_all"][1], d["results"]["query_and_key_all"][1])),
    # logpi_recovery.
    ("c = {:.2f} to {:.2f}, correlation >= {:.3f}, worst column-softmax error {:.3f} at the fitted scale ({:.3f} at "
     "scale 1)", "figures/logpi_recovery.json",
     lambda d: (*d["results"]["c_range"], d["results"]["min_correlation"], d["results"]["worst"]["error_fitted_max"],
                d["results"]["worst"]["error_unit_max"])),
    ("row softmax is {:.3f} from pi", "figures/logpi_recovery.json",
     lambda d: (d["results"]["ov"]["error_fitted_max"],)),
    ("matches pi to {}.", "figures/logpi_recovery.json",
     lambda d: (_sci(d["results"]["ov"]["effective_value"]["error_max"]),)),
    ("with c about {:.1f} (Proposition 1)", "figures/logpi_recovery.json",
     lambda d: (sum(d["results"]["c_range"]) / 2,)),
    # block_structure.
    ("Off-diagonal / diagonal block-norm ratio {:.3f} (Theorem 1: 0); the key-token row {:.3f} of the diagonal; the "
     "query-token column exactly {:.0f}", "figures/block_structure.json",
     lambda d: (d["results"]["ratio"], d["results"]["token_key_row_mean_over_diag"],
                max(d["results"]["token_query_column"]))),
    ("In a {}-step run the ratio falls from {:.3f} at step {} to {:.3f}.", "figures/block_structure.json",
     lambda d: (d["results"]["emergence"][-1]["step"], d["results"]["emergence"][0]["ratio"],
                d["results"]["emergence"][0]["step"], d["results"]["emergence"][-1]["ratio"])),
    # bma_agreement.
    ("falls from {:.2f} at beta = 1 to {} at 10 and {} from 31.6 on", "figures/bma_agreement.json",
     lambda d: ({r["beta"]: r["tv"] for r in d["results"]["theorem1"]["sweep"]}[1.0],
                _sci({r["beta"]: r["tv"] for r in d["results"]["theorem1"]["sweep"]}[10.0]),
                _sci0(max(r["tv"] for r in d["results"]["theorem1"]["sweep"] if r["beta"] > 31)))),
    ("grows {:.2f}, {:.2f}, {:.2f}, {:.3f}, {:.3f} at L = 1, 4, 16, 32, 64", "figures/bma_agreement.json",
     lambda d: tuple({r["L"]: r["parent_mass"] for r in d["results"]["bma_vs_L"]}[L] for L in (1, 4, 16, 32, 64))),
    ("short trained models ({} steps) follow it ({:.3f}, {:.3f}, {:.3f} at L = 1, 4, 16)", "figures/bma_agreement.json",
     lambda d: (d["results"]["train_steps"], *(r["parent_mass"] for r in d["results"]["trained_vs_L"]))),
    # init_gradient.
    ("Autograd matches the closed form `-A (v/p - 1)` to {}.", "figures/init_gradient.json",
     lambda d: (_sci0(d["results"]["by_tree"]["max_abs_autograd_vs_closed"]),)),
    ("the largest in {:.0f}% of {} (tree, h) pairs, all {} paired differences", "figures/init_gradient.json",
     lambda d: (100 * d["results"]["by_tree"]["parent_largest_in_expectation"], len(d["results"]["by_tree"]["rows"]),
                d["results"]["by_tree"]["n_excluding_zero"])),
    ("in a single context only {:.0f}%", "figures/init_gradient.json",
     lambda d: (100 * d["results"]["by_tree"]["single_context_parent_largest"],)),
    ("reaches 90% of BMA's parent accuracy in ~{} steps", "figures/init_gradient.json", lambda d: (_first_step(d, 0.9),)),
    # information.
    ("{} DPI violations in {:,} (tree, h, h') pairs", "figures/information.json",
     lambda d: (d["results"]["dpi_violations"], d["results"]["n_pairs_checked"])),
    ("over {} kernels", "figures/information.json", lambda d: (len(d["results"]["kernels"]),)),
    ("Lemma 4 margins all positive (min {:.2f})", "figures/information.json",
     lambda d: (d["results"]["lemma4_min_margin"],)),
    # continuous.
    ("its accuracy gap falls from {:.3f} at L = 1 to {:.3f} at L = 16; the fitted W has cosine {:.4f} with A",
     "figures/continuous.json",
     lambda d: (d["results"]["bma"][0]["parent_acc"] - d["results"]["bilinear"][0]["parent_acc"],
                d["results"]["bma"][-1]["parent_acc"] - d["results"]["bilinear"][-1]["parent_acc"],
                d["results"]["bilinear"][0]["cos_W_A"])),
    # linear_probes.
    ("held-out accuracy {:.2f} (shuffled-label control <= {:.2f})", "figures/linear_probes.json",
     lambda d: (min(max(row) for row in d["results"]["copyers"]["test_acc"]),
                max(max(row) for row in d["results"]["copyers"]["control_acc"]))),
    # Circuit discovery: circuit.json (--checkpoint standard) and the seed-1 model's circuit_seed1.json.
    ("the model's progress on the held-out contexts is {:.3f} +- {:.3f}; the circuit has {} of the {} heads and MLPs "
     "({}) and {} of the {} edges", CIRCUIT, _shape),
    ("On {} held-out contexts it carries the demonstrations' evidence: its edges alone keep {:.3f} +- {:.3f} of the "
     "progress under the demonstrations corruption ({:.3f} +- {:.3f} with every other edge mean-ablated). It computes "
     "the prediction: its nodes alone keep {:.3f} +- {:.3f} with every other head and MLP mean-ablated, and "
     "{:.3f} +- {:.3f} with each resampled from a fresh context", CIRCUIT, _answers),
    ("Re-measured on {} other fresh contexts: {:.3f} +- {:.3f} ({:.3f} +- {:.3f}); {:.3f} +- {:.3f} and "
     "{:.3f} +- {:.3f}", CIRCUIT, lambda d: _answers(d, "replicate")),
    ("under the demonstrations corruption {} edges keep {:.3f} +- {:.3f} on the search contexts ({} of them within 2 "
     "standard errors of zero), under mean ablation {} edges keep {:.3f} +- {:.3f} ({})", CIRCUIT, _searches),
    ("(L0H0 {:+.3f} +- {:.3f}, L0H4 {:+.3f} +- {:.3f}, L1H2 {:+.3f} +- {:.3f}, L1H4 {:+.3f} +- {:.3f}, MLP0 "
     "{:+.3f} +- {:.3f}, MLP1 {:+.3f} +- {:.3f} nats); the costliest head left out is L0H1 ({:+.4f} +- {:.4f})",
     CIRCUIT, lambda d: _costs(d, ["L0H0", "L0H4", "L1H2", "L1H4", "MLP0", "MLP1", "L0H1"])),
    ("KL to the full model {:.3f} +- {:.3f} nats; the faithfulness curve's area is {:.2f}", CIRCUIT,
     lambda d: (d["results"]["kl_to_full"], d["results"]["kl_to_full_se"], d["results"]["curve_area"])),
    ("which writes the output (the largest edge, {:+.2f} nats)", CIRCUIT, lambda d: (_edge(d, "MLP1", "output", "out")[0],)),
    ("layer 1's values at the demonstration positions {:.3f} +- {:.3f} nats, its keys there {:.3f} +- {:.3f}, its "
     "queries at the target {:.4f} +- {:.4f}. This agrees", CIRCUIT,
     lambda d: (*_into(d, "L1", "v", "demonstrations"), *_into(d, "L1", "k", "demonstrations"), *_into(d, "L1", "q", "target"))),
    ("runs/standard_seed2_w96 --threads 1` (the default flags; 11 minutes wall on the shared 2 cores; its JSON is "
     "`docs/reproductions/circuit_seed2_w96.json`): the model's progress on the held-out contexts is {:.3f} +- {:.3f}; "
     "the circuit has {} of the {} heads and MLPs ({}) and {} of the {} edges", SEED2, _shape),
    ("On {} held-out contexts it carries the demonstrations' evidence: {:.3f} +- {:.3f} ({:.3f} +- {:.3f} with every "
     "other edge mean-ablated); it computes the prediction: {:.3f} +- {:.3f} with every other head and MLP "
     "mean-ablated, {:.3f} +- {:.3f} resampled", SEED2, _answers),
    ("Re-measured on {} other fresh contexts: {:.3f} +- {:.3f} ({:.3f} +- {:.3f}); {:.3f} +- {:.3f} and {:.3f} +- {:.3f}. "
     "All four agree", SEED2, lambda d: _answers(d, "replicate")),
    ("the costliest left out is L1H6 ({:+.4f} +- {:.4f} nats)", SEED2, lambda d: _costs(d, ["L1H6"])),
    ("under the demonstrations corruption {} edges keep {:.3f} +- {:.3f} on the search contexts ({} of them within 2 "
     "standard errors of zero), under mean ablation {} keep {:.3f} +- {:.3f} ({}): more edges", SEED2, _searches),
    ("`docs/reproductions/circuit_seed1*`): the model's progress on the held-out contexts is {:.3f} +- {:.3f}; the "
     "circuit has {} of the {} heads and MLPs ({}) and {} of the {} edges", SEED1, _shape),
    ("On {} held-out contexts it carries the demonstrations' evidence: {:.3f} +- {:.3f} ({:.3f} +- {:.3f} with every "
     "other edge mean-ablated); it computes the prediction: {:.3f} +- {:.3f} with every other head and MLP "
     "mean-ablated, {:.3f} +- {:.3f} resampled", SEED1, _answers),
    ("Re-measured on {} other fresh contexts: {:.3f} +- {:.3f} ({:.3f} +- {:.3f}); {:.3f} +- {:.3f} and {:.3f} +- {:.3f}. "
     "All four agree", SEED1, lambda d: _answers(d, "replicate")),
    ("(L0H1 {:+.3f} +- {:.3f}, L0H2 {:+.3f} +- {:.3f}, L0H5 {:+.3f} +- {:.3f}, MLP0 {:+.3f} +- {:.3f}, L1H3 {:+.3f} +- "
     "{:.3f}, MLP1 {:+.3f} +- {:.3f} nats); the costliest left out is L1H2 ({:+.4f} +- {:.4f} nats)", SEED1,
     lambda d: _costs(d, ["L0H1", "L0H2", "L0H5", "MLP0", "L1H3", "MLP1", "L1H2"])),
    ("under the demonstrations corruption {} edges keep {:.3f} +- {:.3f} on the search contexts ({} of them within 2 "
     "standard errors of zero), under mean ablation {} keep {:.3f} +- {:.3f} ({}).", SEED1, _searches),
    ("layer 1's values at the demonstration positions {:.3f} +- {:.3f} nats (shipped {:.3f} +- {:.3f}), its keys there "
     "{:.3f} +- {:.3f} ({:.3f} +- {:.3f}), its queries at the target {:.4f} +- {:.4f} ({:.4f} +- {:.4f}); MLP0's input at "
     "the demonstrations {:.3f} +- {:.3f} ({:.3f} +- {:.3f}); MLP1 to the output {:+.2f} +- {:.2f} nats ({:+.2f} +- {:.2f})",
     SEED1,
     lambda d: tuple(x for ins in (("L1", "v", "demonstrations"), ("L1", "k", "demonstrations"), ("L1", "q", "target"),
                                   ("MLP0", "in", "demonstrations"))
                     for x in (*_into(d, *ins), *_into(_load(CIRCUIT), *ins)))
     + (*_edge(d, "MLP1", "output", "out"), *_edge(_load(CIRCUIT), "MLP1", "output", "out"))),
    ("(L1H3 into MLP1 {:+.3f} +- {:.3f} nats, then L1H6 {:+.3f} +- {:.3f}), where the shipped model splits it between two "
     "(L1H4 {:+.3f} +- {:.3f}, L1H2 {:+.3f} +- {:.3f})", SEED1,
     lambda d: (*_edge(d, "L1H3", "MLP1"), *_edge(d, "L1H6", "MLP1"), *_edge(_load(CIRCUIT), "L1H4", "MLP1"),
                *_edge(_load(CIRCUIT), "L1H2", "MLP1"))),
    ("are smaller ({:.3f} +- {:.3f} against {:.3f} +- {:.3f}), so more edges are needed for 0.9 ({} against the shipped "
     "model's {})", SEED1,
     lambda d: (*_into(d, "MLP1", "in", "target"), *_into(_load(CIRCUIT), "MLP1", "in", "target"),
                len(d["results"]["edges"]), len(_load(CIRCUIT)["results"]["edges"]))),
    # Standard transformers: standard_circuit.json (--checkpoint standard).
    ("(512 contexts): progress {:.3f}; the paper's circuit is absent", SC, lambda d: (d["results"]["progress"],)),
    ("({:.2f} to {:.2f} on earlier tokens of it, {:.2f} to {:.2f} on itself;", SC,
     lambda d: (*_role_range(d, 0, "prefix"), *_role_range(d, 0, "self"))),
    ("(same position h {:.2f} to {:.2f}, other positions {:.2f} to {:.2f}) and put at most {:.2f} on the target's "
     "candidate parents", SC,
     lambda d: (*_role_range(d, 1, "same_position"), *_role_range(d, 1, "other_position"),
                _role_range(d, 1, "candidates", queries=(1,))[1])),
    ("restores {:.2f}; mean-ablating them costs {:.2f} nats", SC,
     lambda d: (d["results"]["interventions"]["groups"]["within"]["patching_restored"],
                d["results"]["interventions"]["groups"]["within"]["ablation_dnll"])),
    ("so do the cross-demonstration layer-1 heads (patching restores {:.2f}; ablation +{:.2f} nats)", SC,
     lambda d: (d["results"]["interventions"]["groups"]["readers"]["patching_restored"],
                d["results"]["interventions"]["groups"]["readers"]["ablation_dnll"])),
    ("(largest mass on them {}): the paper's", SC,
     lambda d: (re.search(r"candidates from the target queries ([\d.]+)", d["results"]["checks"][2]["numbers"]).group(1),)),
    ("(summed KL over h: earlier {:.3f}, at h {:.3f}, later {:.3f})", SC,
     lambda d: tuple(sum(x for x in d["results"]["corruption"][k]["model"] if x is not None)
                     for k in ("earlier", "at_h", "later"))),
    ("(linear-probe accuracy {:.2f} in the embedding, {:.2f} after layer 0)", SC,
     lambda d: (_pair_acc(d, "blocks.0.hook_resid_pre"), _pair_acc(d, "blocks.0.hook_resid_post"))),
    ("(slope {:.2f}, correlation {:.2f}; KL to BMA-without-l {:.4f} -> {:.4f}, the clean model's KL to BMA being {:.4f})",
     SC, lambda d: tuple(d["results"]["bma_without"]["readers"][k] for k in
                         ("slope", "correlation", "kl_without_vs_clean", "kl_without_vs_ablated", "kl_bma_vs_clean"))),
    ("carries only {:.2f} of the corruption effect directly and {:.2f} through the layer-0 MLP", SC,
     lambda d: (d["results"]["path_patching"]["all"], d["results"]["path_patching"]["all_through_mlp"])),
    ("against the {:.2f} of patching the layer-0 heads everywhere", SC,
     lambda d: (d["results"]["interventions"]["groups"]["within"]["patching_restored"],)),
    ("reaches held-out R^2 {:.2f} from the embedding, {:.2f} after layer 0's attention and {:.2f} after layer 0 (a "
     "function of x_h' plus one of x_h: {:.2f})", SC,
     lambda d: (*(d["results"]["logpi"]["r2"][f"blocks.0.hook_resid_{k}"] for k in ("pre", "mid", "post")),
                d["results"]["logpi"]["additive_r2"])),
    ("(correlation {:.2f}, largest column error {:.3f}; the additive read-out's {:.2f} and {:.3f})", SC,
     lambda d: (d["results"]["logpi"]["implied"]["correlation"], d["results"]["logpi"]["implied"]["column_softmax_max_error"],
                d["results"]["logpi"]["additive_implied"]["correlation"],
                d["results"]["logpi"]["additive_implied"]["column_softmax_max_error"])),
    # CAPE: cape_structure.json.
    ("(trained at L = 10: {:.3f} vs BMA {:.3f}; Theorem 1 elsewhere) identify parents at {:.2f} from L = 20 "
     "demonstrations of the Markov task and the continuous system's Gaussian BMA at {:.2f} from L = 20", CS,
     lambda d: ({r["L"]: r["parent_accuracy"] for r in d["results"]["model"]}[10], _bma_at(d, "markov", 10),
                _bma_at(d, "markov", 20), _bma_at(d, "continuous", 20))),
    ("needs N = 500 samples for the Markov skeleton (F1 {:.2f}; {:.2f} at N = 100) and N = 100 on the continuous "
     "system (F1 {:.2f})", CS,
     lambda d: (_struct(d, "markov/linear", 500, "skeleton_f1"), _struct(d, "markov/linear", 100, "skeleton_f1"),
                _struct(d, "continuous/linear", 100, "skeleton_f1"))),
    ("(parent accuracy {:.2f} and {:.2f} at N = 500)", CS,
     lambda d: (_struct(d, "markov/linear", 500, "parent_accuracy"), _struct(d, "continuous/linear", 500, "parent_accuracy"))),
    ("parents are {:.2f} at N = 100 ({:.2f} at N = 500)", CS,
     lambda d: (_struct(d, "markov/linear", 100, "ordered_parent_accuracy"),
                _struct(d, "markov/linear", 500, "ordered_parent_accuracy"))),
    ("(continuous system, N = 100: skeleton F1 {:.2f} against {:.2f} with the linear f", CS,
     lambda d: (_struct(d, "continuous/mlp", 100, "skeleton_f1"), _struct(d, "continuous/linear", 100, "skeleton_f1"))),
    ("skeleton F1 {:.2f} against {:.2f} at N = 500", CS,
     lambda d: (_struct(d, "nonlinear/mlp", 500, "skeleton_f1"), _struct(d, "nonlinear/linear", 500, "skeleton_f1"))),
    # CAPE: cape_downstream.json is the --seed 0 tree: the first of each "a / b / c" triple.
    ("(M = {} features, d = {}, rho = {}, {} training samples)", CD,
     lambda d: tuple(d["results"]["config"][k] for k in ("M", "d", "rho", "n_train"))),
    ("(0.{:03.0f} per coordinate; predicting 0 gives {:.0f})", CD,
     lambda d: (1000 * d["results"]["bayes_mse"], d["results"]["marginal_mse"])),
    ("a learned slot PE is as useless as none ({:.2f} /", CD, lambda d: (d["results"]["variants"]["slot"]["mean"],)),
    ("barely helps ({:.2f} /", CD, lambda d: (d["results"]["variants"]["cape"]["mean"],)),
    ("(scGPT's gene token, {:.2f} /", CD, lambda d: (d["results"]["variants"]["identity"]["mean"],)),
    ("lowers the error to {:.2f} /", CD, lambda d: (d["results"]["variants"]["identity_cape"]["mean"],)),
    ("worse on all three trees but by little ({:.2f} /", CD,
     lambda d: (d["results"]["variants"]["identity_cape_random"]["mean"],)),
    ("Euclidean instead of hyperbolic changes nothing ({:.2f} /", CD,
     lambda d: (d["results"]["variants"]["identity_cape_euclidean"]["mean"],)),
    ("additive instead of rotary is not worse ({:.2f} /", CD,
     lambda d: (d["results"]["variants"]["identity_cape_additive"]["mean"],)),
    ("The true tree instead of the learned one gives {:.2f} /", CD,
     lambda d: (d["results"]["variants"]["identity_cape_oracle"]["mean"],)),
    ("uniform {:.2f}): CAPE alone {:.2f} /", CD,
     lambda d: (d["results"]["blanket_chance"], d["results"]["variants"]["cape"]["blanket_attention"][0])),
    ("the identity token {:.2f} /", CD, lambda d: (d["results"]["variants"]["identity"]["blanket_attention"][0],)),
    ("identity + CAPE {:.2f} /", CD, lambda d: (d["results"]["variants"]["identity_cape"]["blanket_attention"][0],)),
    ("a random DAG's angles do about as well ({:.2f} /", CD,
     lambda d: (d["results"]["variants"]["identity_cape_random"]["blanket_attention"][0],)),
    ("additive coordinates better ({:.2f} /", CD,
     lambda d: (d["results"]["variants"]["identity_cape_additive"]["blanket_attention"][0],)),
    # CAPE: properties.
    ("(per-graph Spearman {:.2f} on trees, {:.2f} on DAGs, random-angle control {:.2f})", "figures/cape_properties.json",
     lambda d: (d["results"]["summary"]["tree"]["rho_score_distance"]["mean"],
                d["results"]["summary"]["dag"]["rho_score_distance"]["mean"],
                d["results"]["summary"]["tree"]["rho_random_angles"]["mean"])),
    ("(at most ~{:.0f}% below its maximum)", "figures/cape_properties.json",
     lambda d: (100 * d["results"]["summary"]["all"]["rel_score_drop"]["max"],)),
    ("embedding norms grow with depth (Spearman {:+.2f} on trees)", "figures/cape_properties.json",
     lambda d: (d["results"]["summary"]["tree"]["rho_norm_depth"]["mean"],)),
    ("`python -m analyses.cape_properties` (23 s, {} random graphs)", "figures/cape_properties.json",
     lambda d: (d["results"]["n_graphs"],)),
    ("L0H4 (within-sequence, ablation {:+.3f} nats), L1H2 and L1H4 (cross-demonstration same-position readers, {:+.3f} "
     "and {:+.3f}, patching restores {:.2f} and {:.2f})", "figures/inspect_standard.json",
     lambda d: (_head(d, "L0H4")["ablation_dnll"], _head(d, "L1H2")["ablation_dnll"], _head(d, "L1H4")["ablation_dnll"],
                _head(d, "L1H2")["patching_restored"], _head(d, "L1H4")["patching_restored"])),
    ("the effect of L1H2 and L1H4 ({:.3f} +- {:.3f} and {:.3f} +- {:.3f} nats) goes through their values (shares "
     "{:.3f} +- {:.3f} and {:.3f} +- {:.3f}; keys {:.3f} and {:.3f}, queries {:.3f}), and L1H1's too ({:.2f} +- {:.2f} "
     "of {:.3f} +- {:.3f} nats)", "figures/inspect_standard.json",
     lambda d: (*(d["results"]["inputs"][h][k] for h in ("L1H2", "L1H4") for k in ("cost", "se")),
                *(d["results"]["inputs"][h]["v"][k] for h in ("L1H2", "L1H4") for k in ("share", "share_se")),
                d["results"]["inputs"]["L1H2"]["k"]["share"], d["results"]["inputs"]["L1H4"]["k"]["share"],
                abs(max(d["results"]["inputs"][h]["q"]["share"] for h in ("L1H2", "L1H4"))),
                d["results"]["inputs"]["L1H1"]["v"]["share"], d["results"]["inputs"]["L1H1"]["v"]["share_se"],
                d["results"]["inputs"]["L1H1"]["cost"], d["results"]["inputs"]["L1H1"]["se"])),
    ("disentangled model's L1H0 (queries {:.2f}, keys {:.2f}, values {:.3f} of its {:.3f} nats", "figures/inspect.json",
     lambda d: (*(d["results"]["inputs"]["L1H0"][x]["share"] for x in ("q", "k", "v")),
                d["results"]["inputs"]["L1H0"]["cost"])),
    # Trajectories and the peers' tasks (docs/reproductions/: the reproduction table).
    *TRAJECTORY_CLAIMS,
]

# Numbers the README states that no committed JSON holds, or that this registry does not map yet.
UNCHECKED = [
    ("docs/results/analyses.md and benchmark.md: the paper run's 470 s wall, 926 s summed, circuit 319 s, cape_structure 157 s, cape_downstream 128 s, standard_circuit 107 s; the JSON comparison (1e-6, up to 0.3%)", "python -m analyses.paper --out /tmp/paper_run --jobs 2 on 2026-12-03 and a comparison against figures/*.json; timings and a check, not committed"),
    ("README.md, docs/results/tests.md and conftest.SLOW: the suite's times before and after issue 43 (32 min 47 s / 482 s CPU / 513 s per test at load 3-12; 17 min 0 s / 365 s / 371 s at load 7-15; 11 min 49 s / 395 s / 405 s at load 7-4, 32 tests added, 1.85; 3 min 43 s / 223 s / 362 s user + 30 s system / 1.6 GB on idle cores at 99f1882, CI's 210 s at 7cb6639, its first twelve --durations; mkdocs build 6.7 s / 5.5 s, serve's first page 6.6 s, the circuit's 115 s / 114 s / 1.4 GB; benchmark.md's inspect on the GPT-2-small shape on idle cores, 4 min 41 s / 271 s / 10 s / 2.41 GB, 137 and 7 heads; 263 s and 89 s of CPU for the suite less test_docs.py and for test_docs.py; 75 s / 15 s, 82 s / 6 s, 37 s / 4 s, 1.3 s a forked case; the two --durations=30 lists; SLOW's seconds)", "/usr/bin/time -v, pytest --durations and a CPU-per-test plugin, 2026-12-04; timings, not committed"),
    ("docs/results/circuit.md: the shipped circuit's demonstrations faithfulness on 22 more sets of 512 (0.889 on "
     "average, 0.855 to 0.923, spread 0.0143 +- 0.0022, reported SE 0.0134, held out +1.5 / replicate -2.2 of their "
     "SEs, pooled 0.889 +- 0.003, correlation -0.78, 33-51% of the variance in 10 contexts)",
     "the page's snippet, run on 2026-12-03; not committed"),
    ("2026-12-03: the seed-1 large run's 1313 s / 1042 s (21.9 / 17.4 min), kernel 384 s / 7 s, 163 / 0.5 million "
     "page faults, 1.4 / 2.0 GB; bench 601 ms / 386 ms and 1.84 s / 1.22 s; CI 9.4 / 7.7 min; 1.26x; 300 MB, "
     "42 MB, 32 MB, 2 GB",
     "/usr/bin/time of the runs (300 MB: its page faults over the steps), python -m bench --only large printed the "
     "day before, bash .ci/run, glibc's documented thresholds and tensor sizes; not committed"),
    ("the peers' numbers in the reproduction table and its setup paragraph (0.837 +- 0.054, 20 DAGs, 16384 steps of "
     "1024, 16.8M, 9000 sequences, 50000 epochs, lr 1, T = 20/50/100, Dirichlet(0.1)/(1))",
     "their papers and code (the README names the files); the CPU seconds of (3)-(4) are timings"),
    ("regeneration within 1.8e-5 (3.2e-3 on another machine), 54 s; ~20 s; 339 s / 599 s wall for analyses.paper",
     "timings and a one-off comparison made by hand on 2026-12-01 (models.train --out X, then the largest weight "
     "difference to models/checkpoints/default); no file records them"),
    ("bench circuit rows (60.1 s / 125.2 s, 2.1x; 4.47 s / 49.3 s, 11x; EAP 0.18 s, EAP-IG 0.72 s and 2.22 s "
     "against 9.32 s, Spearman 0.81 / 0.993, 0.26 / 0.975, 0.24 / 0.975, keeps 0.89, 0.95, 1.00) and the "
     "analysis's wall and CPU times (388 s, 380 s, 229 s; 87 s, 82 s, 15 s)",
     "python -m bench --only circuit output and /usr/bin/time of python -m analyses.circuit, 2026-12-02, on a "
     "shared machine; no committed file records them"),
    ("another seed and width: progress 0.948 at the end of training, 8 minutes; width 48 reached only 0.675",
     "runs/standard_seed2_w96/training.json and the width-48 run's, not committed (the circuit's JSON is "
     "docs/reproductions/circuit_seed2_w96.json)"),
    ("another seed: progress 0.995 at the end of training, 61 minutes; the circuit run's 290 s wall",
     "models.standard --seed 1's training.json and /usr/bin/time of the circuit run, 2026-12-03, not committed "
     "(its circuit's JSON is: docs/reproductions/circuit_seed1.json)"),
    ("docs/results/standard.md: the one-copyer nanoGPT's report (progress 0.404 +- 0.068, keep -0.469 +- 0.265, "
     "L0H1 +0.1109 +- 0.0249 nats) and circuit's 0.998 +- 0.006 / 0.992 +- 0.003, BMA 0.4312, plateau "
     "0.9797 beside inspect's", "inspect.summary of the model tests/analyses/test_inspect.py builds (the test "
     "recomputes them; no JSON is committed) and figures/circuit.json's search and held-out fields"),
    ("default run ends 4096-context test", "tests/models/training/test_checkpoint_and_train.py thresholds, not results"),
    ("purity 0.68 -> 0.58, TV 0.022 (--init-demo 3, lr 3e-2, 4000 steps); 0.94 -> 0.75 (--init-demo 5)",
     "training runs whose output is not committed; the README gives the command"),
    ("Theorem 1 numbers in the head_ablation row (2e-16, TV 3e-4)", "from a run with --checkpoint theorem1:beta=50 "
     "whose JSON is not committed; the README gives the command"),
    ("linear_probes: 'pa(h) at chance from the layer-2 query', 'a small GPT-2 decodes no demonstration token'",
     "qualitative statements; no number stated"),
    ("standard checkpoint on 4096 fresh contexts: gap 0.0045, NLL 0.3772, BMA 0.3726, plateau 0.9515, progress 0.992",
     "models.evaluate output, not committed; training.json's last eval (2048 contexts) differs in the 3rd decimal"),
    ("the demonstrations are worth 0.58 nats", "plateau minus BMA on the 4096 evaluate contexts (0.9515 - 0.3726), "
     "not committed; training.json's plateau_gap on its 2048 eval contexts is 0.607"),
    ("0.32 nats; progress 0.42/0.67/0.70 at 2500/5000/6500 steps; plateau control 0.023 nats, progress 0.04",
     "models.standard runs whose output is not committed; the README gives the commands"),
    ("paper run longest first: 1.18 / 1.02 times half the summed time, 286.5 s / 485.0 s (load 1.5), 456.6 s / "
     "897.1 s (load 3.7); phase diagram re-plot 5 s, quick grid 163 s", "timings printed by analyses.paper "
     "(2026-12-02) and the quick grid's committed figures/phase_diagram.json (commit 2885f03)"),
    ("phase diagram, the quick grid before the full sweep: 0.33 and 0.65 to 0.82 at half the budget",
     "the quick grid's figures/phase_diagram.json that the full sweep replaced (in git history, commit 2885f03)"),
    ("1165 s; 416 KB; 99 s; 56 s; 23 s; 86 s; 2436 s; 5159 s; 1182 s; 0.23/0.8/1.5 s a step", "timings"),
    ("where a large step goes: 1.62 s, 38% / 33% / 29%, 5 ms, 43 ms, 3.0 s, 2%; copies 1.64 s vs 0.55 s (3.0x); "
     "0.097 s vs 0.41 s; 4.19 s vs 2.20 s (1.9x); gradient differences 2.1%, 0.24%, 0.6%, 0.4%, loss 2e-4; load "
     "1.8 to 9", "timings and one-batch comparisons printed by scripts of the session that made them (issue 25)"),
    ("bench large row: 7.10 s, 13.40 s, 1.9x, load 9.3 / 7.5, 2 x 8 steps", "python -m bench --only large output "
     "of 2026-12-02, not committed; the README gives the command"),
    ("autocast candidate at steps 100/500/600/800/1000: gap 0.2388/0.2274/0.1150/0.0395/0.0291, TV 0.852/0.793/"
     "0.363/0.096/0.0645, purity 0.902; --lr 3e-2 run: 0.2545, 0.2578; step 2300",
     "training runs whose output is not committed (the README gives the commands); 2300 is read from "
     "scale_histories.json by bench.steps_to_targets"),
    ("medium at step 1500 on 4096 fresh contexts: gap 0.0047, TV 0.040, accuracy 0.951 (BMA 0.965)",
     "models.evaluate output, not committed; scale.json's last eval is on 1024 contexts"),
    ("large on 4096 fresh contexts: gap 0.0067, TV 0.022, accuracy 0.984 (BMA 0.999); x0.1: 0.0081, 0.022, 0.981",
     "models.evaluate output, not committed; scale.json holds the 256/512-context training evals"),
    ("e^w / (e^w + L - 1): 0.94, 0.82; offset 0.70 vs 0.24", "closed-form arithmetic in the text"),
    ("CAPE downstream, the second and third of each 'a / b / c' triple and the 1000-step 0.284",
     "runs with --seed 1, 2 and --steps 1000 whose JSON is not committed (figures/cape_downstream.json is --seed 0)"),
    ("continuous: KL 0.023 and 1.6e-16 on a small case", "measured in tests/analyses/test_continuous.py (d=3), the README says so"),
    ("CAPE structure: 'N = 500', '5 to 25 times fewer samples'", "sample sizes and a ratio of them, not results"),
    ("benchmark.md, a model of GPT-2 small's size: the run alone (599 s wall at 48% of a core, 290 s CPU, 281 / 9 s, "
     "2.36 GB, load 4.4 to 5.1); 2.2 MB / 42.0 MB / 8.4 MB / 3.9 MB a context; 57 and 256 contexts a pass; 2.6e14 "
     "FLOPs, 7 heads; Spearman 0.04 / 0.83 and 5 of 7 carriers on the shipped GPT-2; the shipped JSON to 1e-9, "
     "inputs 1.2e-8 nats and 3e-5", "/usr/bin/time -v of python -m analyses.inspect, cli.context_bytes, the run's "
     "inspect.json and a comparison of main's and this branch's JSON, 2026-12-04 (issue 44); not committed"),
]


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@functools.lru_cache(maxsize=None)
def _written_text() -> str:
    """README.md and every Markdown page under docs/, normalised: where a number may be stated."""
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    return "\n".join(_normalise(p.read_text()) for p in pages)


@functools.lru_cache(maxsize=None)
def _load(path: str):
    return json.loads((ROOT / path).read_text())


@pytest.mark.parametrize("phrase, source, get", CLAIMS, ids=[c[0][:40] for c in CLAIMS])
def test_readme_number_matches_json(phrase, source, get):
    """The README or a docs page contains the phrase with the numbers formatted from the JSON they came from."""
    readme = _written_text()
    values = get(_load(source))
    expected = _normalise(phrase.format(*values))
    if expected in readme:
        return
    # The README's version of the phrase: the same words with any numbers in the fields.
    pattern = r"[^\s,;()]+".join(re.escape(f) for f in re.split(r"\{[^}]*\}", _normalise(phrase)))
    match = re.search(pattern, readme)
    found = match.group(0) if match else "(phrase not found at all)"
    pytest.fail(f"stale claim from {source}:\n  expected: {expected!r}\n  written:  {found!r}\n"
                f"  JSON values: {values!r}")


def test_scale_json_and_histories_agree():
    """scale.json and scale_histories.json hold the same runs, so one registry entry covers both."""
    scale = _load(SCALE)["results"]
    histories = _load("figures/scale_histories.json")
    assert set(histories) == set(scale)
    for name, run in histories.items():
        assert [r["step"] for r in run["history"]] == scale[name]["step"], name
        assert [r["nll_gap"] for r in run["history"]] == scale[name]["nll_gap"], name


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


# Pages the docs site generates when it is built (docs/scripts/gen_pages.py; mkdocs build --strict in
# tests/project/test_docs.py checks every link into them): the API reference and the entry points' flags.
GENERATED = [ROOT / "docs" / "reference" / "api", ROOT / "docs" / "reference" / "cli.md"]


def _documents():
    return [README, ROOT / "figures" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    """Every relative link and image points at a file in the repository, never out of it through ../."""
    bad = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # an absolute URL or an anchor in the same page
        path = target.split("#", 1)[0]
        resolved = (doc.parent / path).resolve()
        if ".." in Path(path).parts and not resolved.is_relative_to(ROOT):
            bad.append(f"{target} (leaves the repository)")
        elif not resolved.is_relative_to(ROOT):
            bad.append(f"{target} (outside the repository)")
        elif not resolved.exists() and not any(resolved.is_relative_to(g) for g in GENERATED):
            bad.append(f"{target} (no such file)")
    assert not bad, f"{doc.relative_to(ROOT)}: broken relative links: {bad}"
