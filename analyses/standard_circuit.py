"""Which circuit does a standard transformer use on the task? Causal tests of the "transposed" circuit
(pair tokens within each sequence in layer 0, then read position h across the demonstrations in layer
1) against the paper's (copy each demonstration, then select the parent), and where log pi lives.

    python -m analyses.standard_circuit                          # --checkpoint standard (the shipped GPT-2)
    python -m analyses.standard_circuit --checkpoint runs/standard

The head groups come from the role profile (``probes.roles``): WITHIN-SEQUENCE layer-0 heads (at least
half their attention, from demonstration queries, on the same sequence, more of it on earlier tokens
than on their own position) and CROSS-DEMONSTRATION layer-1 heads (at least half their attention, from the target
queries, on the demonstrations; how much of it on position h is reported). Then, on fresh contexts:

1. ablation and patching: mean-ablating each group (and the rest of its layer) costs how much of the
   model's gain over the uniform-parent plateau; patching the group's clean output into a run whose
   demonstrations come from another tree restores how much of the clean-vs-corrupted difference;
2. corruption of demonstration l: re-drawing (uniformly) its tokens at positions h' < h, at h, or at
   h' > h, and measuring how far the model's prediction of the target's x_h moves (KL), beside how far
   BMA's moves (BMA's prediction of x_h depends on x_h'^l for h' <= h only);
3. path patching: the corrupted output of one layer-0 head at the demonstration positions, fed only
   into the keys and values of one layer-1 head (the rest of the model clean), as a share of the
   clean-vs-corrupted NLL difference;
4. linear probes at the demonstration position (l, h): the pair (x_h'^l, x_h^l) (d^2 classes) decoded from
   the embedding, after layer-0 attention and after layer 0 (``probes.linear``);
5. BMA without a demonstration: zero the attention of the cross-demonstration heads (or of all layer-1
   heads) from the target queries to demonstration l; does the model's prediction move the way BMA's
   moves when l is dropped (``bma_predictive(..., demonstrations=keep)``)? The slope and correlation of
   the model's change on BMA's change, and the KL to BMA without l before and after;
6. where log pi lives: a ridge read-out of log pi(x_h^l | x_h'^l) from the residual at (l, h), held-out
   R^2 per site against the best function of x_h' plus a function of x_h (a read-out from a sum of
   token embeddings can do no better); and the d x d matrix that read-out implies, against log pi by the
   column softmax of Proposition 1 after a fitted scale (``probes.metrics``).
"""

from __future__ import annotations

from analyses import common

NAME = "standard_circuit"
REQUIRES = frozenset({common.MARKOV_TASK})  # what it needs of its subject
CHECKPOINT = "standard"  # the default --checkpoint: this analysis is about the shipped standard GPT-2


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    n_contexts: int = common.n_contexts(512, "contexts to sample (at least 16: the probes' train/test split)", 16)

common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from models.interp.circuit import Node
from models.interp.interventions import ablate, corrupted_contexts, head_outputs, patch_heads
from models.interp.path_patching import bma_without, kl_rows, layer0_outputs, path_patch
from models.interp.subject import Subject, head_label
from models.plumbing.progress import progress as progress_bar
from probes import bma_predictive, target_nll
from probes.linear import linear_probe
from probes.metrics import column_softmax_error, fit_column_shift
from probes.roles import ROLE_MASS, ROLE_OVER_CHANCE, clears_chance, role_profile

FIGURES = {
    "standard_circuit.png": (
        "causal tests of the transposed circuit on a standard transformer, one prediction per panel: patching restores / mean ablation costs (as a share of the gain over the plateau) per head group; corruption of one demonstration's earlier tokens / token at h / later tokens, model vs BMA, per target position h; path patching from each layer-0 head into each layer-1 head's keys and values (values printed); whether zeroing what layer 1 reads from demonstration l moves the model like BMA without l (slope, correlation)."
    ),
    "standard_circuit_logpi.png": (
        "decoding the pair (x_h', x_h) of a demonstration at position h and reading log pi(x_h | x_h') from the residual there: held-out accuracy and R^2 per site against the additive baseline; the implied d x d matrix against log pi."
    ),
}
SITES = ("blocks.0.hook_resid_pre", "blocks.0.hook_resid_mid", "blocks.0.hook_resid_post")
SITE_NAMES = ("embedding", "after layer-0 attention", "after layer 0")
PATCH_CONTEXTS = 128  # contexts for the patching and path-patching runs (as analyses.inspect)
MIN_PATCH_EFFECT = 0.005  # nats between clean and corrupted runs for a restored share to be defined


def share_of(value: float, clean: float, corrupted: float) -> float | None:
    """``(value - clean) / (corrupted - clean)``; None when the corruption makes no difference."""
    return (value - clean) / (corrupted - clean) if abs(corrupted - clean) >= MIN_PATCH_EFFECT else None


# Head groups ---------------------------------------------------------------------------------------
@torch.no_grad()
def head_groups(subject: Subject, tokens, parents) -> dict:
    """Role profile of every head, and the within-sequence layer-0 and cross-demonstration layer-1 heads."""
    profiles = [role_profile(a.pattern, a.query_predicts, a.key_token, parents, subject.task.n_examples)
                for a in subject.attention(tokens)]  # fmt: skip
    heads, within, readers = [], [], []
    for layer, prof in enumerate(profiles):
        for j in range(subject.n_heads[layer]):
            one = {k: v[j] for k, v in prof.items()}
            heads.append({"label": head_label(layer, j), "layer": layer, **{k: v.tolist() for k, v in one.items()}})
            own_sequence = float(one["prefix"][0] + one["self"][0])  # from the demonstration queries
            demonstrations = float(one["same_position"][1] + one["other_position"][1])  # from the target queries
            if layer == 0 and own_sequence >= ROLE_MASS and one["prefix"][0] >= one["self"][0]:
                within.append(j)
            if layer == 1 and demonstrations >= ROLE_MASS:
                readers.append(j)
    return {"heads": heads, "within": within, "readers": readers}


# 1. Ablation and patching of groups ----------------------------------------------------------------
@torch.no_grad()
def group_interventions(
    subject: Subject, tokens, corrupted, groups: dict[str, tuple[int, list[int]]], log=None
) -> dict:
    """Per group (layer, heads): NLL change under mean ablation, and the share of the clean-vs-corrupted
    NLL difference that patching its clean outputs into the corrupted run restores."""
    clean_z = head_outputs(subject, tokens)
    nll_clean = target_nll(subject.log_probs(tokens), tokens)
    nll_corrupt = target_nll(subject.log_probs(corrupted), corrupted)
    out = {"nll_clean": nll_clean, "nll_corrupted": nll_corrupt, "groups": {}}
    for name, (layer, heads) in groups.items():
        if not heads:
            out["groups"][name] = {"layer": layer, "heads": [], "ablation_dnll": None, "patching_restored": None}
            continue
        ablated = target_nll(subject.log_probs(tokens, ablate(subject, layer, heads, "mean", log=log)), tokens)
        patched = target_nll(subject.log_probs(corrupted, patch_heads(subject, layer, heads, clean_z, log)), corrupted)
        out["groups"][name] = {
            "layer": layer,
            "heads": [head_label(layer, j) for j in heads],
            "ablation_dnll": ablated - nll_clean,
            "patching_restored": share_of(nll_corrupt - patched + nll_clean, nll_clean, nll_corrupt),
        }
    return out


# 2. Corrupting one demonstration ---------------------------------------------------------------------
KINDS = ("earlier", "at_h", "later")


@torch.no_grad()
def demonstration_corruption(subject: Subject, tokens, seed: int) -> dict:
    """For each h >= 1 and each kind (positions h' < h, h, h' > h of demonstration l, every l in turn,
    re-drawn uniformly): KL from the clean to the corrupted prediction of the target's x_h, for the
    model and for BMA, averaged over l; ``[kind][h - 1]``."""
    task = subject.task
    L, H, d = task.n_examples, task.seq_len, task.d_vocab
    g = torch.Generator().manual_seed(seed + 31)
    clean = subject.log_probs(tokens)
    bma = bma_predictive(task.pi, tokens, L, H, task.root, log=True).double()
    out = {k: {"model": [0.0] * (H - 1), "bma": [0.0] * (H - 1)} for k in KINDS}
    for h in range(1, H):
        positions = {"earlier": list(range(h)), "at_h": [h], "later": list(range(h + 1, H))}
        for kind, where in positions.items():
            if not where:
                out[kind]["model"][h - 1] = out[kind]["bma"][h - 1] = None
                continue
            for l in range(L):
                bad = tokens.clone()
                flat = torch.tensor([l * H + p for p in where])
                bad[:, flat] = torch.randint(0, d, (len(tokens), len(flat)), generator=g)
                out[kind]["model"][h - 1] += kl_rows(clean, subject.log_probs(bad))[h].item() / L
                bma_bad = bma_predictive(task.pi, bad, L, H, task.root, log=True).double()
                out[kind]["bma"][h - 1] += kl_rows(bma, bma_bad)[h].item() / L
    return out


# 3. Path patching (one path: models.interp.path_patching.path_patch) ---------------------------------
@torch.no_grad()
def path_patching(subject: Subject, tokens, corrupted, log: list | None = None) -> dict:
    """Share of the clean-vs-corrupted NLL difference carried by each path layer-0 head (at the
    demonstration positions) -> layer-1 head (keys and values), ``[sender][receiver]``, directly
    (``share``) and with the layer-0 MLP on the way (``share_through_mlp``); and all layer-0 heads into
    all layer-1 heads at once (``all``, ``all_through_mlp``)."""
    positions = subject.layout.token_positions()[: subject.task.n_examples].flatten()
    nll_clean = target_nll(subject.log_probs(tokens), tokens)
    nll_bad = target_nll(subject.log_probs(corrupted), corrupted)
    n0, n1 = subject.n_heads[0], subject.n_heads[1]
    out = {"senders": [head_label(0, j) for j in range(n0)], "receivers": [head_label(1, j) for j in range(n1)]}
    outputs = layer0_outputs(subject, tokens, corrupted)  # what every path reads: run once, not once a path
    for key, mlp in (("share", False), ("share_through_mlp", True)):
        out[key] = [[None] * n1 for _ in range(n0)]
        pairs = [(s, r) for s in range(n0) for r in range(n1)]
        for s, r in progress_bar(pairs, "path patching", leave=False):
            out[key][s][r] = share_of(
                path_patch(subject, tokens, corrupted, [s], [r], positions, mlp, log, outputs), nll_clean, nll_bad
            )
        every = path_patch(subject, tokens, corrupted, list(range(n0)), list(range(n1)), positions, mlp, log, outputs)
        out["all" + key[5:]] = share_of(every, nll_clean, nll_bad)
    return out


# 4. Pair probes and 6. log pi read-out ----------------------------------------------------------------
@torch.no_grad()
def demonstration_residuals(subject: Subject, tokens) -> dict[str, Float[Tensor, "batch L H D"]]:
    """The residual at every demonstration position (l, h) at each of ``SITES``."""
    L = subject.task.n_examples
    with warnings.catch_warnings():  # the bridge lists hooks it has gated off; none of ours
        warnings.simplefilter("ignore", UserWarning)
        _, cache = subject.model.run_with_cache(subject.layout.encode(tokens), names_filter=lambda n: n in SITES)
    pos = subject.layout.token_positions()[:L]  # [L, H]
    return {site: cache[site][:, pos].double().cpu() for site in SITES}


def pair_probes(resid: dict, tokens, task, seed: int) -> dict:
    """Held-out accuracy decoding the pair (x_h'^l, x_h^l) at (l, h), per site, ``[h][h']`` for h' < h
    (None elsewhere), with the shuffled-label control and the majority baseline."""
    L, H, d = task.n_examples, task.seq_len, task.d_vocab
    demos = tokens.view(-1, L + 1, H)[:, :L]
    out = {}
    for site in SITES:
        acc, ctrl, major = ([[None] * H for _ in range(H)] for _ in range(3))
        for h in range(1, H):
            for hp in range(h):
                labels = (demos[:, :, hp] * d + demos[:, :, h]).flatten()
                r = linear_probe(resid[site][:, :, h].flatten(0, 1), labels, d * d, seed=seed)
                acc[h][hp], ctrl[h][hp], major[h][hp] = r.test_acc, r.control_acc, r.majority_acc
        out[site] = {"test_acc": acc, "control_acc": ctrl, "majority_acc": major}
    return out


def ridge_r2(x: Float[Tensor, "n f"], y: Float[Tensor, " n"], seed: int, l2: float = 1e-3) -> tuple[float, Tensor]:
    """Held-out R^2 of a ridge regression of ``y`` on ``[x, 1]`` (standardised; seeded 3:1 split), and
    its predictions on every sample."""
    n = len(y)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    test, train = order[: n // 4], order[n // 4 :]
    mean, std = x[train].mean(0), x[train].std(0).clamp_min(1e-8)
    x1 = torch.cat([(x - mean) / std, torch.ones(n, 1, dtype=torch.float64)], 1)
    gram = x1[train].T @ x1[train] + l2 * len(train) * torch.eye(x1.shape[1], dtype=torch.float64)
    pred = x1 @ torch.linalg.solve(gram, x1[train].T @ y[train])
    resid = ((y[test] - pred[test]) ** 2).sum()
    return 1 - (resid / ((y[test] - y[test].mean()) ** 2).sum()).item(), pred


def logpi_readout(resid: dict, tokens, task, seed: int) -> dict:
    """Per site, mean held-out R^2 of reading log pi(x_h^l | x_h'^l) at (l, h) (one regression per
    (h, h' < h)); the additive baseline (regression on one-hot x_h' and one-hot x_h); and the implied
    matrix M[a, b] (mean prediction where x_h' = a, x_h = b) of the last site's read-out and of the
    additive one, each against log pi: correlation and column-softmax error after a fitted scale and
    column shift (``compare_to_log_pi``)."""
    L, H, d = task.n_examples, task.seq_len, task.d_vocab
    demos = tokens.view(-1, L + 1, H)[:, :L]
    log_pi = task.pi.double().log()
    pairs = [(h, hp) for h in range(1, H) for hp in range(h)]
    out = {"r2": dict.fromkeys(SITES, 0.0), "additive_r2": 0.0}
    implied = {
        "implied": torch.zeros(2, d, d, dtype=torch.float64),
        "additive_implied": torch.zeros(2, d, d, dtype=torch.float64),
    }
    for h, hp in pairs:
        a, b = demos[:, :, hp].flatten(), demos[:, :, h].flatten()
        additive = torch.cat([F.one_hot(a, d), F.one_hot(b, d)], 1).double()
        fits = [(site, resid[site][:, :, h].flatten(0, 1)) for site in SITES] + [("additive", additive)]
        for site, x in fits:
            r2, pred = ridge_r2(x, log_pi[a, b], seed)
            if site == "additive":
                out["additive_r2"] += r2 / len(pairs)
            else:
                out["r2"][site] += r2 / len(pairs)
            key = {"additive": "additive_implied", SITES[-1]: "implied"}.get(site)
            if key is not None:
                implied[key][0].index_put_((a, b), pred, accumulate=True)
                implied[key][1].index_put_((a, b), torch.ones_like(pred), accumulate=True)
    for key, (sums, counts) in implied.items():
        out[key] = compare_to_log_pi(sums / counts.clamp_min(1), counts > 0, log_pi)
    return out


def compare_to_log_pi(matrix: Float[Tensor, "d d"], seen, log_pi: Float[Tensor, "d d"]) -> dict:
    """``matrix`` (unseen pairs filled with the mean) against log pi: the fitted scale c and correlation
    of ``fit_column_shift``, and the column-softmax error of ``matrix / c`` (Proposition 1's comparison)."""
    matrix = matrix.double().clone()
    matrix[~seen] = matrix[seen].mean()
    c, _, _, corr = fit_column_shift(matrix, log_pi)
    worst, mean = column_softmax_error(matrix / c if c > 0 else matrix, log_pi)
    return {"matrix": matrix.tolist(), "scale": c, "correlation": corr,
            "column_softmax_max_error": worst, "column_softmax_mean_error": mean}  # fmt: skip


# 5. BMA without a demonstration: models.interp.path_patching.bma_without ----------------------------
def _nan_matrix(rows) -> Tensor:
    return torch.tensor([[float("nan") if v is None else v for v in row] for row in rows], dtype=torch.float64)


def _fmt(x, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


# The whole analysis --------------------------------------------------------------------------------
def checks(r: dict) -> list[tuple[str, bool, str]]:
    """Each prediction of the transposed circuit, whether the measurements bear it out, and the numbers."""
    gain = r["nll_uniform"] - r["nll"]
    g = r["interventions"]["groups"]
    out = []
    for name, what in (("within", "within-sequence layer-0 heads"), ("readers", "cross-demonstration layer-1 heads")):
        if not g[name]["heads"]:
            out.append((f"{what} exist", False, "no head has that role profile"))
            continue
        share = g[name]["ablation_dnll"] / gain if gain > 0 else float("nan")
        restored = g[name]["patching_restored"]
        out.append((
            f"the {what} ({', '.join(g[name]['heads'])}) carry the demonstrations' information: patching their clean "
            f"outputs into a run on another tree's demonstrations restores at least half the difference",
            restored is not None and restored >= 0.5,
            f"patching restores {_fmt(restored)}; mean ablation +{g[name]['ablation_dnll']:.4f} nats "
            f"({share:.2f} of the gain {gain:.4f} over the plateau)",
        ))  # fmt: skip
    selectors = [h for h in r["heads"] if h["layer"] == 1 and h["candidates"][1] >= 0.5]
    most = max((h["candidates"][1] for h in r["heads"] if h["layer"] == 1), default=float("nan"))
    out.append((
        "no layer-1 head selects among the target's candidate parents (the paper's second step is absent)",
        not selectors, f"largest layer-1 mass on the candidates from the target queries {most:.2f}",
    ))  # fmt: skip
    c = r["corruption"]
    model = {k: sum(v for v in c[k]["model"] if v is not None) for k in KINDS}
    out.append((
        "the model's prediction of x_h moves with demonstration tokens at h and before, not after (as BMA's)",
        min(model["earlier"], model["at_h"]) > 5 * model["later"],
        f"summed KL over h: earlier {model['earlier']:.4f}, at h {model['at_h']:.4f}, later {model['later']:.4f}",
    ))  # fmt: skip
    if "path_patching" in r and g["within"]["heads"] and g["readers"]["heads"]:
        pp, w, rd = r["path_patching"], r["groups"]["within"], r["groups"]["readers"]
        inside = {key: _nan_matrix(pp[key])[w][:, rd].sum().item() for key in ("share", "share_through_mlp")}
        out.append((
            "the layer-0 heads' outputs at the demonstration positions, read by layer 1's keys and values, carry "
            "the demonstrations' information (at least 0.3 of the corruption effect, with the layer-0 MLP on the path)",
            pp["all_through_mlp"] is not None and pp["all_through_mlp"] >= 0.3,
            f"all layer-0 heads -> all layer-1 heads: {_fmt(pp['all'])} directly, {_fmt(pp['all_through_mlp'])} through "
            f"the MLP; summed single paths within -> cross-demonstration heads {inside['share']:.2f} directly, "
            f"{inside['share_through_mlp']:.2f} through the MLP",
        ))  # fmt: skip
    if "pair_probes" in r:
        mean = {}
        for site in (SITES[0], SITES[-1]):
            acc = r["pair_probes"][site]["test_acc"]
            vals = [acc[h][hp] for h in range(len(acc)) for hp in range(h)]
            mean[site] = sum(vals) / len(vals)
        out.append((
            "layer 0 gathers the pairs (x_h', x_h) of a demonstration at position h",
            mean[SITES[-1]] >= mean[SITES[0]] + 0.2,
            f"mean pair accuracy {mean[SITES[0]]:.2f} in the embedding, {mean[SITES[-1]]:.2f} after layer 0",
        ))  # fmt: skip
    b = r["bma_without"]["readers"]
    if b is not None:
        out.append((
            "zeroing what the cross-demonstration heads read from demonstration l moves the model like BMA without l",
            b["correlation"] >= 0.5 and 0.5 <= b["slope"] <= 1.5,
            f"slope {b['slope']:.2f}, correlation {b['correlation']:.2f}; KL to BMA without l "
            f"{b['kl_without_vs_clean']:.4f} -> {b['kl_without_vs_ablated']:.4f} (clean model to BMA {b['kl_bma_vs_clean']:.4f})",
        ))  # fmt: skip
    return out


def conclusion(r: dict) -> str:
    results = checks(r)
    held = [name for name, ok, _ in results if ok]
    failed = [name for name, ok, _ in results if not ok]
    if r["progress"] < 0.5:
        head = "the model is on the uniform-parent plateau: there is no circuit to find"
    elif not failed:
        head = ("the measurements support the transposed circuit: layer-0 heads pair tokens within each sequence, "
                "layer-1 heads read position h across the demonstrations, and removing one demonstration from "
                "what they read moves the model like BMA without it")  # fmt: skip
    else:
        head = f"the transposed circuit is supported in part: {len(held)} of {len(results)} predictions hold"
    lines = [head] + [f"  [{'yes' if ok else 'NO'}] {name}: {nums}" for name, ok, nums in results]
    lp = r["logpi"]
    lines.append(
        f"  log pi(x_h | x_h') read out at (l, h): held-out R^2 {lp['r2'][SITES[0]]:.2f} (embedding), "
        f"{lp['r2'][SITES[1]]:.2f} (after layer-0 attention), {lp['r2'][SITES[2]]:.2f} (after layer 0); a function of x_h' "
        f"plus one of x_h reaches {lp['additive_r2']:.2f}; implied matrix vs log pi: correlation "
        f"{lp['implied']['correlation']:.2f}, column-softmax error max {lp['implied']['column_softmax_max_error']:.3f} "
        f"(the additive read-out's: {lp['additive_implied']['correlation']:.2f}, "
        f"{lp['additive_implied']['column_softmax_max_error']:.3f})"
    )
    return "\n".join(lines)


@torch.no_grad()
def circuit(subject: Subject, n_contexts: int, seed: int) -> dict:
    task = subject.task
    L, H = task.n_examples, task.seq_len
    tokens, parents = common.sample_contexts(task, n_contexts, seed)
    nll = target_nll(subject.log_probs(tokens), tokens)
    nll_bma = target_nll(bma_predictive(task.pi, tokens, L, H, task.root, log=True), tokens)
    nll_uniform = target_nll(bma_predictive(task.pi, tokens, L, H, task.root, demonstrations=[], log=True), tokens)
    groups = head_groups(subject, tokens, parents)
    n0, n1 = subject.n_heads[0], subject.n_heads[1]
    sets = {
        "within": (0, groups["within"]),
        "other_layer0": (0, [j for j in range(n0) if j not in groups["within"]]),
        "readers": (1, groups["readers"]),
        "other_layer1": (1, [j for j in range(n1) if j not in groups["readers"]]),
    }
    few = tokens[:PATCH_CONTEXTS]
    log: list = []  # every intervention run, for the JSON
    corrupted = corrupted_contexts(task, few, torch.Generator().manual_seed(seed + 7919))[0]
    r = {
        "nll": nll, "nll_bma": nll_bma, "nll_uniform": nll_uniform,
        "progress": (nll_uniform - nll) / (nll_uniform - nll_bma),
        "heads": groups["heads"], "groups": {"within": groups["within"], "readers": groups["readers"]},
        "interventions": group_interventions(subject, few, corrupted, sets, log),
        "corruption": demonstration_corruption(subject, tokens, seed),
        "bma_without": {
            "readers": bma_without(subject, tokens, groups["readers"]) if groups["readers"] else None,
            "all_layer1": bma_without(subject, tokens, list(range(n1))),
            "all_layer1_renormalised": bma_without(subject, tokens, list(range(n1)), renormalise=True),
        },
    }  # fmt: skip
    r["path_patching"] = path_patching(subject, few, corrupted, log)
    r["intervention_log"] = log
    resid = demonstration_residuals(subject, tokens)
    r["pair_probes"] = pair_probes(resid, tokens, task, seed)
    r["logpi"] = logpi_readout(resid, tokens, task, seed)
    r["checks"] = [{"prediction": n, "holds": ok, "numbers": s} for n, ok, s in checks(r)]
    r["conclusion"] = conclusion(r)
    return r


def compute(subject: Subject, config: Config) -> dict:
    return circuit(subject, config.n_contexts, config.seed)


GROUP_MASS = {  # the group, its layer, the categories of its mass and the query group (0 demonstration, 1 target)
    "within": ("within-sequence layer-0 heads", 0, ("prefix", "self"), 0),
    "readers": ("cross-demonstration layer-1 heads", 1, ("same_position", "other_position"), 1),
}


def group_lines(r: dict) -> list[str]:
    """Each head group with every member's mass and its chance (``probes.roles``: uniform causal attention on the
    same queries), and the members whose mass does not clear ``ROLE_OVER_CHANCE`` times it (the groups are chosen
    by mass alone, the role the later sections measure)."""
    heads = {h["label"]: h for h in r["heads"]}
    lines = []
    for name, (words, layer, categories, group) in GROUP_MASS.items():
        cells, at_chance = [], []
        for j in r["groups"][name]:
            h = heads[head_label(layer, j)]
            mass = sum(h[c][group] for c in categories)
            chance = sum(h.get(f"{c}_chance", [0.0, 0.0])[group] for c in categories)
            cells.append(f"{h['label']} {mass:.2f} (chance {chance:.2f})")
            if not clears_chance(mass, chance):
                at_chance.append(h["label"])
        lines.append(f"{words} ({' + '.join(categories)}): " + (", ".join(cells) or "none found"))
        if at_chance:
            lines.append(f"  not {ROLE_OVER_CHANCE:g}x their chance, so no role by inspect's rule: {', '.join(at_chance)}")
    return lines


def summary(r: dict) -> str:
    lines = [
        f"{NAME}: NLL {r['nll']:.4f}, BMA {r['nll_bma']:.4f}, plateau {r['nll_uniform']:.4f} "
        f"(progress {r['progress']:.3f})",
        *group_lines(r),
        "",
        f"{'group':14s}{'heads':>28s}{'ablate dNLL':>13s}{'patch':>8s}",
    ]
    for name, g in r["interventions"]["groups"].items():
        if g["heads"]:
            lines.append(
                f"{name:14s}{','.join(g['heads']):>28s}{g['ablation_dnll']:+13.4f}{_fmt(g['patching_restored']):>8s}"
            )
    lines += ["", "corrupting demonstration l (KL of the prediction of x_h, model / BMA), per h:"]
    for kind in KINDS:
        c = r["corruption"][kind]
        cells = " ".join("   -   " if m is None else f"{m:.3f}/{b:.3f}" for m, b in zip(c["model"], c["bma"]))
        lines.append(f"  {kind:8s} {cells}")
    pp = r["path_patching"]
    for key, how in (("share", "directly"), ("share_through_mlp", "through the layer-0 MLP")):
        lines += ["", f"path patching share {how} (rows: layer-0 sender at demonstration positions; columns: layer-1 "
                  f"receiver's keys and values); all into all: {_fmt(pp['all' + key[5:]])}"]  # fmt: skip
        lines.append("      " + "".join(f"{x:>7s}" for x in pp["receivers"]))
        for s, row in zip(pp["senders"], pp[key]):
            lines.append(f"{s:6s}" + "".join(f"{_fmt(v, 3):>7s}" for v in row))
    lines += ["", "BMA without demonstration l (mean over l):"]
    for name, b in r["bma_without"].items():
        if b is not None:
            lines.append(
                f"  {name:24s} slope {b['slope']:.2f} corr {b['correlation']:.2f}  KL(BMA-l || model) "
                f"{b['kl_without_vs_clean']:.4f} -> {b['kl_without_vs_ablated']:.4f}"
            )
    lines += ["", r["conclusion"]]
    return "\n".join(lines)


GROUP_NAMES = {
    "within": "within-sequence\nlayer-0 heads",
    "other_layer0": "other\nlayer-0 heads",
    "readers": "cross-demonstration\nlayer-1 heads",
    "other_layer1": "other\nlayer-1 heads",
}
BMA_WITHOUT_NAMES = {
    "readers": "cross-demonstration\nlayer-1 heads",
    "all_layer1": "all layer-1 heads",
    "all_layer1_renormalised": "all layer-1 heads,\nrenormalised",
}


def _heads_short(heads: list[str]) -> str:
    """``L0H0, L0H1, L0H2, L0H4`` -> ``L0H0-2,4``: a head list of one layer that fits under a bar."""
    if not heads:
        return ""
    nodes = [Node.parse(h) for h in heads]
    layer, nums = f"L{nodes[0].layer}H", [n.head for n in nodes]
    runs, start = [], nums[0]
    for a, b in zip(nums, nums[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return layer + ",".join(runs)


def figures(result: common.Result) -> dict:
    r = result.data
    import textwrap

    import matplotlib.pyplot as plt
    import numpy as np

    gain = r["nll_uniform"] - r["nll"]
    fig, axes = plt.subplots(2, 2, figsize=(14, 10.5), layout="constrained")
    # (a) the head groups: patching restores, ablation costs (both as shares)
    ax = axes[0, 0]
    g = {k: v for k, v in r["interventions"]["groups"].items() if v["heads"]}
    x = np.arange(len(g))
    restored = [np.nan if v["patching_restored"] is None else v["patching_restored"] for v in g.values()]
    cost = [v["ablation_dnll"] / gain if gain > 0 else np.nan for v in g.values()]
    # Two quantities, two axes: the share restored lies in [0, 1]; the ablation cost, in units of the
    # model's gain over the plateau, may exceed 1 (ablating a group can do worse than the plateau).
    bars = ax.bar(x - 0.2, restored, 0.4, color="C0", label="patching clean → corrupted: share restored (left)")
    ax.bar_label(bars, fmt="%.2f", fontsize=9)
    ax.axhline(0.5, color="C0", ls=":", lw=1, label="0.5 restored: the group carries the information")
    right = ax.twinx()
    right.grid(False)
    label = f"mean ablation: NLL cost ÷ gain over the plateau ({gain:.2f} nats) (right)"
    bars = right.bar(x + 0.2, cost, 0.4, color="C1", label=label)
    right.bar_label(bars, fmt="%.2f", fontsize=9)
    ax.set_xticks(x, [f"{GROUP_NAMES.get(k, k)}\n({_heads_short(v['heads'])})" for k, v in g.items()], fontsize=9)
    ax.set_ylim(0, 1.5)  # headroom: the legend sits above the bars
    right.set_ylim(0, 1.5 * max(1.0, np.nanmax(cost) if np.isfinite(cost).any() else 1.0))
    ax.set_ylabel("patching: share of the clean NLL restored", color="C0")
    right.set_ylabel("mean ablation: NLL cost ÷ the gain over the plateau", color="C1")
    ax.set_title("the two head groups carry the demonstrations' information", fontsize=11)
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, loc="upper center")
    # (b) corrupting one demonstration at positions before h, at h, after h: model vs BMA
    ax = axes[0, 1]
    hs = np.arange(1, len(r["corruption"]["earlier"]["model"]) + 1)
    names = {"earlier": "tokens at h' < h", "at_h": "token at h", "later": "tokens at h' > h"}
    for i, kind in enumerate(KINDS):
        c = r["corruption"][kind]
        ax.plot(
            hs, [np.nan if v is None else v for v in c["model"]], "o-", color=f"C{i}", label=f"model, {names[kind]}"
        )
        ax.plot(hs, [np.nan if v is None else v for v in c["bma"]], "x--", color=f"C{i}", label=f"BMA, {names[kind]}")
    ax.set_xticks(hs)
    ax.set(xlabel="target position h", ylabel="KL(clean ‖ corrupted) of the prediction of x_h")
    ax.set_title(
        "re-drawing one demonstration's tokens moves the prediction\nof x_h at h and before, not after (as BMA's)",
        fontsize=11,
    )
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi + 0.4 * (hi - lo))  # headroom: the legend sits above the curves
    ax.legend(fontsize=8, ncol=3, loc="upper center")
    # (c) path patching: layer-0 head at the demonstrations -> one layer-1 head's keys and values
    ax = axes[1, 0]
    pp = r["path_patching"]
    share = 1000 * _nan_matrix(pp["share_through_mlp"]).numpy()  # in the cells' unit, so the bar reads alike
    lim = max(np.nanmax(np.abs(share)) if np.isfinite(share).any() else 0, 1e-3)
    im = ax.imshow(share, cmap="RdBu_r", vmin=-lim, vmax=lim)
    ax.grid(False)
    for i in range(share.shape[0]):
        for j in range(share.shape[1]):
            if np.isfinite(share[i, j]):
                ax.text(j, i, f"{share[i, j]:.1f}", ha="center", va="center", fontsize=8,
                        color="w" if abs(share[i, j]) > 0.6 * lim else "k")  # fmt: skip
    ax.set_xticks(range(len(pp["receivers"])), pp["receivers"], fontsize=9)
    ax.set_yticks(range(len(pp["senders"])), pp["senders"], fontsize=9)
    ax.set(xlabel="layer-1 receiver (its keys and values)", ylabel="layer-0 sender (at the demonstrations)")
    ax.set_title(
        f"path patching through the layer-0 MLP (cells: share × 1000)\nall layer-0 → all layer-1 heads: "
        f"{_fmt(pp['all_through_mlp'])} through the MLP, {_fmt(pp['all'])} directly",
        fontsize=11,
    )
    fig.colorbar(im, ax=ax, shrink=0.8, label="share of the corruption's NLL effect × 1000")
    # (d) zeroing what layer 1 reads from demonstration l: like BMA without l?
    ax = axes[1, 1]
    names = [k for k, v in r["bma_without"].items() if v is not None]
    vals = [r["bma_without"][k] for k in names]
    x = np.arange(len(names))
    bars = ax.bar(x - 0.2, [v["slope"] for v in vals], 0.4, color="C0", label="slope of the model's change on BMA's")
    ax.bar_label(bars, fmt="%.2f", fontsize=9)
    bars = ax.bar(x + 0.2, [v["correlation"] for v in vals], 0.4, color="C2", label="correlation")
    ax.bar_label(bars, fmt="%.2f", fontsize=9)
    ax.axhline(1, color="k", ls=":", lw=1, label="1: exactly BMA without l")
    ax.set_xticks(x, [BMA_WITHOUT_NAMES.get(k, k) for k in names], fontsize=9)
    ax.set_ylim(0, 1.25)
    ax.set_title("zeroing what layer 1 reads from demonstration l\nmoves the model like BMA without l", fontsize=11)
    ax.legend(fontsize=8, loc="upper left")
    first = r["conclusion"].splitlines()[0]
    model = Path(str(result.title or "model")).name or str(result.title)  # a user's path by its last part
    fig.suptitle("\n".join(textwrap.wrap(f"{model}: {first}", 110)), fontsize=12)

    fig2, axes2 = plt.subplots(1, 3, figsize=(17, 5), layout="constrained")
    pair = r["pair_probes"]
    acc0 = pair[SITES[0]]["test_acc"]
    ticks = [f"{h},{hp}" for h in range(len(acc0)) for hp in range(h)]
    for i, (site, label) in enumerate(zip(SITES, SITE_NAMES)):
        acc = pair[site]["test_acc"]
        vals = [acc[h][hp] for h in range(len(acc)) for hp in range(h)]
        ctrl = [pair[site]["control_acc"][h][hp] for h in range(len(acc)) for hp in range(h)]
        axes2[0].plot(vals, "o-", color=f"C{i}", label=label)
        axes2[0].plot(ctrl, ":", color=f"C{i}")
    axes2[0].set_xticks(range(len(ticks)), ticks, fontsize=8, rotation=90)
    axes2[0].set(xlabel="(h, h'), h' < h", ylabel="held-out accuracy of (x_h', x_h)")
    axes2[0].set_title(
        "layer 0 gathers the pair (x_h', x_h) at position h\n(dotted: shuffled-label control)", fontsize=11
    )
    axes2[0].set_ylim(-0.02, 1.3)  # headroom: the legend sits above the curves (accuracies lie in 0..1)
    axes2[0].set_yticks(np.linspace(0, 1, 6))
    axes2[0].legend(fontsize=9, ncol=2, loc="upper center")
    lp = r["logpi"]
    bars = axes2[1].bar(range(len(SITES)), [lp["r2"][s] for s in SITES], color="C0")
    axes2[1].bar_label(bars, fmt="%.2f", fontsize=9)
    axes2[1].axhline(
        lp["additive_r2"], color="C3", ls="--", label=f"f(x_h') + g(x_h) baseline ({lp['additive_r2']:.2f})"
    )
    axes2[1].set_xticks(range(len(SITES)), SITE_NAMES, fontsize=9)
    axes2[1].set(ylabel="held-out R²")
    axes2[1].set_title("reading log π(x_h | x_h') from the residual at (l, h)", fontsize=11)
    axes2[1].legend(fontsize=9)
    m = np.array(lp["implied"]["matrix"])
    im = axes2[2].imshow(m, cmap="viridis")
    axes2[2].grid(False)
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            axes2[2].text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=8,
                          color="k" if m[i, j] > np.nanmean(m) else "w")  # fmt: skip
    axes2[2].set_xticks(range(m.shape[1]))
    axes2[2].set_yticks(range(m.shape[0]))
    axes2[2].set(xlabel="x_h", ylabel="x_h'")
    axes2[2].set_title(
        f"the implied d × d matrix: corr with log π {lp['implied']['correlation']:.2f},\n"
        f"col-softmax error {lp['implied']['column_softmax_max_error']:.3f}\n"
        f"(additive read-out: {lp['additive_implied']['correlation']:.2f}, "
        f"{lp['additive_implied']['column_softmax_max_error']:.3f})",
        fontsize=11,
    )
    fig2.colorbar(im, ax=axes2[2], shrink=0.8, label="log π(x_h | x_h') read out after layer 0")
    fig2.suptitle(f"{model}: where the pairs and log π live", fontsize=12)
    return {"standard_circuit": fig, "standard_circuit_logpi": fig2}



ANALYSIS = common.register(globals())
