"""``analyses.inspect``'s measurement: every number its report prints, and the verdict's inputs, as one plain
dict (``inspect_subject``). Per head of every layer: the attention against the BMA posterior, copy mass, role
profile and sequence scores; mean-ablation cost and patching share, each with its standard error over the
contexts; the progress from the uniform-parent plateau to BMA with its standard error; the sufficiency of
the named heads (every other head mean-ablated); and through which input each last-layer head acts. The
verdict's rules and thresholds (``THRESHOLDS``, one table), and what each sentence of the report needs of the
numbers (``SENTENCES``: a share only of a denominator beyond 2 SE of zero), are ``analyses.inspect``'s docstring's; its
wording, the printed summary and the figures live there and only format this result.

Work that grows with the model: the log-probs and the attention come from one pass, in batches that fit in memory;
the clean and corrupted runs of the intervention contexts are made once; the heads' interventions run stacked along
the batch (``models.interp.interventions.run_copies``); each stage reports its progress
(``models.plumbing.progress``). A stage whose exact runs would take more than ``WORK_BOUND`` FLOPs (a GPT-2
small's 144 heads: 13 times the bound) says so in the result (``estimated``), estimates every head by attribution
patching and re-measures exactly the heads it ranks first, as many as the bound allows; only heads measured
exactly are named."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial

import torch
from jaxtyping import Float
from torch import Tensor

from models.interp.baselines import baselines, head_attention_stats
from models.interp.circuit import INPUTS, build_graph, mean_se, per_context_nll, ratio_se
from models.interp.circuit import beyond_2se as circuit_beyond_2se
from models.interp.interventions import (
    Intervention,
    activation_grads,
    corrupted_contexts,
    even_parts,
    head_ablation,
    head_patch,
    hooks,
    log_intervention,
    recorded_run,
    rows_per_pass,
    run_copies,
)
from models.interp.memory import check_contexts_fit, flops_per_context, forward_bytes, forward_peak
from models.interp.subject import head_label
from models.plumbing.config import MAX_CONTEXTS
from models.plumbing.progress import progress as progress_bar
from probes import target_nll
from probes.graph_task import context_order
from probes.oracles import uniform_parent_predictive
from probes.roles import (
    ROLE_MASS,
    ROLE_OVER_CHANCE,
    attention_role,
    best_offset,
    clears_chance,
    position_role,
    position_scores,
    role_profile,
    sequence_scores,
)
from probes.tasks import check_int

INTERVENTION_CONTEXTS = 128  # ablation, patching and sufficiency: the first of the contexts, as many as
# analyses.circuit searches on (another sample: both report their standard errors, and agree within them)

THRESHOLDS = {  # name: (value, what it decides). Every verdict prints the ones behind it.
    "plateau_progress": (0.1, "ON THE UNIFORM-PARENT PLATEAU: progress below this by more than 2 SE"),
    "off_plateau_progress": (0.5, "off the plateau: progress at least this (between the two: leaving it)"),
    "min_plateau_gap": (0.005, "nats between the plateau's and BMA's NLL below which no verdict is possible"),
    "rounding": (1e-6, "a difference (nats) or share at most this is float rounding, whatever its SE: no measurement"),
    "select_fraction": (0.5, "a parent-selecting head closes this share of the uniform -> BMA parent-accuracy gap"),
    "min_candidate_mass": (0.5, "a parent-selecting head puts this attention mass on the candidate parents"),
    "copy_mass": (0.5, "a copyer of demonstration l puts this attention on position h of it"),
    "min_patch_effect": (0.005, "nats between the clean and corrupted runs for patching to be defined"),
    "carry_fraction": (0.1, "a carrier's ablation costs this share of the gain over the plateau, or its patching "
                            "restores this share of the clean-vs-corrupted difference"),
    "cost_z": (3.0, "a head whose mean ablation costs more than this many standard errors is always named"),
    "sufficient": (0.8, "THE PAPER'S CIRCUIT: its heads alone, every other head mean-ablated, keep this share of the "
                        "progress"),
    "n_distributed": (3, "heads named when no single head reaches the carrying bar"),
    "values_share": (0.8, "a last-layer head whose value input carries this share of its inputs' cost pools evidence "
                          "through its values"),
    "select_share": (0.5, "... whose query and key inputs carry this share selects through its keys/queries"),
    "sequence_mass": (ROLE_MASS, "a role (previous-token, induction, own-parent, sink, self, fixed-offset, an "
                                 "attention category) needs this mass on its keys"),
    "over_chance": (ROLE_OVER_CHANCE, "... and this many times its chance: what uniform causal attention puts there "
                                      "on the same contexts and queries"),
}


def th(name: str) -> float:
    """The value of threshold ``name`` (``THRESHOLDS``)."""
    return THRESHOLDS[name][0]


SENTENCES = {  # what inspect's report may say, and the numbers that must hold for it to say it (else, what it says)
    "progress": "the progress (a share of the plateau-to-BMA gap) only when that gap is >= min_plateau_gap and beyond "
                "2 SE of zero; else: no verdict, no head credited",
    "worse": "WORSE THAN THE UNIFORM-PARENT PLATEAU only when the progress is below 0 by more than 2 SE (and the NLL "
             "above the plateau's by more than rounding); then it names what to check first (task.json's layout, the token "
             "offset) and credits no head, nor says what any head computes",
    "plateau": "ON THE UNIFORM-PARENT PLATEAU only when the progress is below plateau_progress by more than 2 SE",
    "no_progress": "NO PROGRESS BEYOND ITS STANDARD ERROR when the progress is within 2 SE of zero and not below "
                   "plateau_progress by 2 SE: no head credited",
    "leaving": "LEAVING THE PLATEAU: the progress beyond 2 SE of zero and below off_plateau_progress",
    "plateau_heads": "heads that 'compute the plateau's own prediction': on the plateau (not below it), each with a mean "
                     "ablation costing > cost_z SE",
    "carrier": "a head carries the computation only off the plateau: its ablation costs >= carry_fraction of the gain "
               "and beyond 2 SE, or its patching restores >= carry_fraction beyond 2 SE (or it costs > cost_z SE)",
    "share": "every share printed (patching, an input's share of a head's cost, sufficiency) has its denominator's mean "
             "beyond 2 SE of zero, and positive; else no share, and the reason in one line and in the JSON",
    "sufficiency": "a sufficiency only when some head was mean-ablated and the model's gain over the plateau (its "
                   "denominator) is beyond 2 SE of zero",
    "paper_circuit": "THE PAPER'S CIRCUIT: copyers and a parent-selecting head off the plateau, and its heads alone keep "
                     ">= sufficient of the progress (or they are every head: nothing else to ablate)",
    "circuit_link": "a path to the discovered circuit only when the file exists, absolute or relative to the current "
                    "folder; else the command that writes it",
}  # fmt: skip


def beyond_2se(mean: float, se: float) -> bool:
    """A share's denominator is worth dividing by (``SENTENCES["share"]``): ``circuit.beyond_2se`` above float
    rounding."""
    return circuit_beyond_2se(mean, se, th("rounding"))


POOLING = "evidence pooled through the values at fixed positions"


def costly(heads: list[dict]) -> list[str]:
    """The heads whose mean ablation costs more than ``cost_z`` standard errors, largest first (of the heads
    measured exactly: an attribution estimate names no head)."""
    order = sorted((h for h in heads if not h.get("estimated")), key=lambda h: -h["ablation_dnll"])
    return [h["label"] for h in order if h.get("ablation_se") is not None
            and h["ablation_dnll"] > th("cost_z") * h["ablation_se"]]  # fmt: skip


def carriers(heads: list[dict], gain: float) -> tuple[list[str], bool]:
    """The heads that carry the computation (``SENTENCES["carrier"]``), largest ablation first, and whether
    it is distributed (no single head reached the bar). Every head whose mean ablation costs more than
    ``cost_z`` standard errors is among them. Only heads measured exactly are named (``estimated`` ones, beyond
    the work bound, are first-order estimates: on the shipped GPT-2 their ablation costs rank the heads with a
    Spearman correlation of 0.04 to the exact ones; see ``WORK_BOUND``)."""
    order = sorted((h for h in heads if not h.get("estimated")), key=lambda h: -h["ablation_dnll"])

    def carries(h: dict) -> bool:
        cost, se = h["ablation_dnll"], h.get("ablation_se") or 0.0
        restored, restored_se = h["patching_restored"], h.get("patching_se") or 0.0
        return (cost >= th("carry_fraction") * gain and beyond_2se(cost, se)) or (
            restored is not None and restored >= th("carry_fraction") and beyond_2se(restored, restored_se))

    chosen = [h["label"] for h in order if carries(h)]
    if chosen:
        return chosen + [c for c in costly(heads) if c not in chosen], False
    top = [h["label"] for h in order[: int(th("n_distributed"))]]
    return top + [c for c in costly(heads) if c not in top], True


def regime_of(progress: float, se: float, above_plateau: float) -> str:
    """Where a model stands (``SENTENCES``): ``worse`` (below the plateau), ``plateau``, ``no_progress``
    (within 2 SE of it), ``leaving`` or ``off``; ``above_plateau``: its NLL minus the plateau's."""
    if progress + 2 * se < 0 and above_plateau > th("rounding"):
        return "worse"
    if progress + 2 * se < th("plateau_progress"):
        return "plateau"
    if not beyond_2se(progress, se):
        return "no_progress"
    return "leaving" if progress < th("off_plateau_progress") else "off"


def verdict(nll: float, base: dict, heads: list[dict], inter: dict | None = None, progress_se: float = 0.0,
            gap_se: float = 0.0) -> dict:  # fmt: skip
    """Apply the module docstring's rules (``SENTENCES``); ``heads`` hold candidate_mass, tv, parent_acc,
    copy_mass, role_profile, and (with ``inter``) ablation_dnll, ablation_se, patching_restored, patching_se;
    ``progress_se`` and ``gap_se``: the standard errors of the progress and of the plateau-to-BMA gap over the
    contexts. ``paper_circuit`` here is the attention's verdict; ``inspect_subject`` also asks that its heads
    be sufficient."""
    gap = base["nll_uniform"] - base["nll_bma"]
    if gap < th("min_plateau_gap") or not beyond_2se(gap, gap_se):  # BMA barely beats the plateau: nothing to credit
        progress, on_plateau, regime = None, None, None
    else:
        progress = (base["nll_uniform"] - nll) / gap
        regime = regime_of(progress, progress_se, nll - base["nll_uniform"])
        on_plateau = regime in ("worse", "plateau", "no_progress")
    bar = base["acc_uniform"] + th("select_fraction") * (base["acc_bma"] - base["acc_uniform"])
    selecting = [
        h["label"]
        for h in heads
        if on_plateau is False
        and h["candidate_mass"] >= th("min_candidate_mass")
        and h["parent_acc"] >= bar
        and h["tv"] < base["tv_uniform"]
    ]
    copyers = {
        h["label"]: int(torch.tensor(h["copy_mass"]).argmax())
        for h in heads
        if max(h["copy_mass"], default=0) >= th("copy_mass")
    }
    best = max(heads, key=lambda h: h["parent_acc"])["label"]
    roles = {h["label"]: head_role(h, selecting, copyers) for h in heads}
    carrying, distributed = [], False
    if on_plateau is False and inter is not None:
        carrying, distributed = carriers(heads, base["nll_uniform"] - nll)
    return {
        "progress": progress,
        "progress_se": progress_se,
        "gap_se": gap_se,
        "on_plateau": on_plateau,
        "regime": regime,
        "worse_than_plateau": regime == "worse",
        "parent_acc_bar": bar,
        "parent_selecting": selecting,
        "copyers": copyers,
        "best_head": best,
        "paper_circuit_attention": on_plateau is False and bool(selecting) and bool(copyers),
        "paper_circuit": on_plateau is False and bool(selecting) and bool(copyers),
        "roles": roles,
        "carriers": carrying,
        "carriers_distributed": distributed,
        "costly_heads": costly(heads) if inter is not None else [],
        "thresholds": {k: v for k, (v, _) in THRESHOLDS.items()},
    }


def head_role(head: dict, selecting: list[str], copyers: dict[str, int]) -> str:
    """Parent selector, copyer of demonstration l, a positional role that clears its chance (sink, sequence
    start, self, fixed offset: ``probes.roles.position_role``), or the role its attention profile shows (a
    category that clears its chance, else "no role"), with the masses and chances behind it."""
    if head["label"] in selecting:
        return "parent selector"
    if head["label"] in copyers:
        return f"copyer of demonstration {copyers[head['label']]}"
    if "position" in head and (found := position_role(head["position"])) is not None:
        return f"{found[0]} [{found[1]}]"
    seq = head.get("sequence", {})
    if roles := sequence_roles(seq):
        key = roles[0]
        words = SEQUENCE_WORDS.get(key) or f"{key.split('_')[1]}-back head"
        return f"{words} [{key} {seq[key]:.2f}, chance {seq[f'{key}_chance']:.2f}]"
    return attention_role({k: torch.tensor(v) for k, v in head["role_profile"].items()})


SEQUENCE_WORDS = {"previous_token": "previous-token head", "induction": "induction head", "own_parent": "own-parent head"}


def sequence_roles(seq: dict) -> list[str]:
    """The sequence scores of one head (``head["sequence"]``) that clear their chance (``clears_chance``), in the
    order ``probes.roles.sequence_scores`` gives them: previous token, induction, own parent, k back."""
    return [k for k in seq if f"{k}_chance" in seq and clears_chance(seq[k], seq[f"{k}_chance"])]


# The clean and corrupted runs every per-head stage starts from, and the bound on exact work ------------------
WORK_BOUND = 2e13  # FLOPs (flops_per_context x context runs) a stage may spend on exact runs: the per-head
# ablation and patching, the inputs of the last layer. Beyond it the stage says so, estimates every head by
# attribution patching and re-measures exactly the heads it ranks first, as many as the rest of the bound allows
# (a GPT-2 small: 12 layers of width 768, 42 positions: 7 heads, about 5 min of one core in all; the shipped models:
# every head, exactly). Only heads measured exactly are named as carriers (``carriers``).
GRAD_PASS = 3  # a pass with gradients costs about three forward passes (the backward pass: two)


@dataclass
class Runs:
    """The intervention contexts ``tokens`` and ``corrupted`` (the same targets, demonstrations from another
    tree), each run once (``record_runs``): the log-probs ``[batch, H, d]`` of both, every layer's ``hook_z`` on
    ``tokens`` (``clean``), the last layer's q, k, v (``last_layer_receivers``) on both (``clean``, ``bad``);
    with gradients, also the first-order estimates of attribution patching, per head and context
    ``[head, batch]``: of mean-ablating the head (``ablation``, the NLL change) and of patching its clean
    ``hook_z`` into the corrupted run (``patching``, the change of that run's NLL), and the gradient of the
    NLL at the last layer's q, k, v (``grad_clean``). Every NLL averages over the target ``positions``
    (``probes.metrics.scored_rows``)."""

    tokens: Tensor
    corrupted: Tensor
    lp_clean: Tensor
    lp_bad: Tensor
    clean: dict
    bad: dict
    ablation: Tensor | None = None
    patching: Tensor | None = None
    grad_clean: dict | None = None
    rows: int = 1  # rows (contexts x copies) a pass of exact runs takes (models.interp.interventions.rows_per_pass)
    positions: str = "all"

    def nll(self, log_probs: Tensor, tokens: Tensor) -> Float[Tensor, " batch"]:
        """Each context's NLL at the target ``positions``, on the CPU."""
        return per_context_nll(log_probs, tokens, self.positions).cpu()

    @property
    def clean_values(self) -> Tensor:
        return self.nll(self.lp_clean, self.tokens)

    @property
    def corrupt_values(self) -> Tensor:
        return self.nll(self.lp_bad, self.corrupted)


def record_runs(subject, tokens, corrupted, captures: list[str], grads: bool, positions: str = "all") -> Runs:
    """Both runs of ``Runs`` (``captures``: the hooks of the last layer's q, k, v); with ``grads``, passes with
    gradients a few contexts at a time, each head's estimates taken from them and the gradients then dropped
    but those at ``captures``. NLLs at the target ``positions``."""
    rows = rows_per_pass(forward_peak(subject)[1], str(subject.model.cfg.device), factor=2.0)
    z = [subject.head_output(i) for i in range(subject.n_layers)]
    if not grads:
        with progress_bar(desc="inspect: the clean and corrupted runs", total=2 * len(tokens)) as bar:
            lp_clean, clean = recorded_run(subject, tokens, z + captures)
            bar.update(len(tokens))
            lp_bad, bad = recorded_run(subject, corrupted, captures)
            bar.update(len(tokens))
        return Runs(tokens, corrupted, lp_clean, lp_bad, clean, bad, rows=rows, positions=positions)
    kept = forward_bytes(subject.log_probs, subject.task, 1)  # a pass with gradients keeps every activation
    grad_rows = rows_per_pass(kept, str(subject.model.cfg.device), factor=2.0)
    jobs = [(i, j) for i, k in enumerate(subject.n_heads) for j in range(k)]
    metric = partial(per_context_nll, positions=positions)
    with progress_bar(desc="inspect: the clean and corrupted runs, with gradients", total=2 * len(tokens)) as bar:
        lp_clean, _, clean, grad = activation_grads(subject, tokens, z + captures, metric, grad_rows, bar)
        mean = {name: clean[name].mean(0, keepdim=True) for name in z}
        ablation = torch.stack([_head_sum(grad[z[i]] * (mean[z[i]] - clean[z[i]]), j) for i, j in jobs])
        grad_clean = {name: grad[name] for name in captures}
        del grad
        lp_bad, _, bad, grad = activation_grads(subject, corrupted, z + captures, metric, grad_rows, bar)
        patching = torch.stack([_head_sum(grad[z[i]] * (clean[z[i]] - bad[z[i]]), j) for i, j in jobs])
        bad = {name: bad[name] for name in captures}
        del grad
    return Runs(tokens, corrupted, lp_clean, lp_bad, clean, bad, ablation, patching, grad_clean, rows, positions)


def _head_sum(x: Tensor, head: int) -> Float[Tensor, " batch"]:
    """``x[:, :, head]`` summed over everything but the batch (a gradient times a change: the first-order
    change of each context's metric), on the CPU."""
    return x[:, :, head].double().flatten(1).sum(1).cpu()


@torch.no_grad()
def interventions(subject, runs: Runs, bound: float = WORK_BOUND) -> dict:
    """Per head: NLL change under mean ablation of its ``hook_z`` (at its mean over the contexts, with its
    standard error), and the share of the clean-vs-corrupted NLL difference restored by patching its clean
    ``hook_z`` into the corrupted run, with its standard error (None for every head when that difference is
    below ``min_patch_effect`` or within 2 SE of zero: ``patching_refused`` says so). The heads' runs are
    stacked along the batch dimension (``run_copies``). When exact runs of every head would take more than
    ``bound`` FLOPs, each head is estimated by attribution patching (``runs`` then holds the estimates: the
    gradient at the clean run times mean - value; at the corrupted run times clean - corrupted value, per
    context) and the heads ranked first (largest estimate of either, each relative to the largest) are
    re-measured exactly, as many as the rest of the bound allows; ``estimated`` lists the heads left with
    estimates."""
    tokens, corrupted, n = runs.tokens, runs.corrupted, len(runs.tokens)
    clean_values, corrupt_values = runs.clean_values, runs.corrupt_values
    nll_clean, nll_corrupt = clean_values.mean().item(), corrupt_values.mean().item()
    effect, effect_se = mean_se(corrupt_values - clean_values)
    jobs = [(i, j) for i, k in enumerate(subject.n_heads) for j in range(k)]
    names = [subject.head_output(i) for i in range(subject.n_layers)]
    mean_z = {name: runs.clean[name].mean(0, keepdim=True) for name in names}
    ablations = [Intervention(names[i], "mean", heads=(j,), source="mean over the batch", value=mean_z[names[i]])
                 for i, j in jobs]  # fmt: skip  (the mean over these contexts, the batch each head's run had)
    patches = [head_patch(subject, i, [j], {i: runs.clean[names[i]]}) for i, j in jobs]
    log: list = []
    for a, p in zip(ablations, patches):
        log_intervention(log, a)
        log_intervention(log, p)
    cost_values = torch.zeros(len(jobs), n, dtype=torch.float64)
    patched = corrupt_values.repeat(len(jobs), 1)  # each head's patched run, per context
    exact_flops = 2 * len(jobs) * n * flops_per_context(subject)
    todo, estimated = list(range(len(jobs))), []
    if exact_flops > bound:  # every head estimated first (record_runs); the first-ranked re-measured below
        cost_values[:], patched = runs.ablation, patched + runs.patching
        room = int(max(0.0, bound - 2 * GRAD_PASS * n * flops_per_context(subject)) // (2 * n * flops_per_context(subject)))
        abl, pat = cost_values.mean(1).abs(), runs.patching.mean(1).abs()
        rank = torch.maximum(abl / abl.max().clamp_min(1e-300), pat / pat.max().clamp_min(1e-300))
        todo = sorted(rank.argsort(descending=True)[:room].tolist())
        estimated = [h for h in range(len(jobs)) if h not in todo]
    what = "inspect: per-head ablation and patching" + (", the first-ranked heads exactly" if estimated else "")
    with progress_bar(desc=what, total=2 * len(todo) * n) as bar:
        if todo:
            lp = run_copies(subject, tokens, [[ablations[h]] for h in todo], runs.rows, bar)
            cost_values[todo] = runs.nll(lp.flatten(0, 1), tokens.repeat(len(todo), 1)).view(len(todo), n) \
                - clean_values  # fmt: skip
            lp = run_copies(subject, corrupted, [[patches[h]] for h in todo], runs.rows, bar)
            patched[todo] = runs.nll(lp.flatten(0, 1), corrupted.repeat(len(todo), 1)).view(len(todo), n)
    # A share of nothing is no share: the demonstrations make no difference the contexts can resolve.
    refused = None
    if abs(effect) < th("min_patch_effect") or not beyond_2se(effect, effect_se):
        refused = (f"corrupting the demonstrations changes the NLL by {effect:+.4f} +- {effect_se:.4f} nats, not "
                   f"beyond 2 SE of zero and {th('min_patch_effect'):g} nats: no share of it to restore")  # fmt: skip
    ablation, ablation_se = zip(*(mean_se(c) for c in cost_values)) if jobs else ((), ())
    shares = [(None, None) if refused else ratio_se(corrupt_values - p, corrupt_values - clean_values) for p in patched]
    out = {
        "nll_clean": nll_clean,
        "nll_corrupted": nll_corrupt,
        "ablation_dnll": list(ablation),
        "ablation_se": list(ablation_se),
        "patching_restored": [share for share, _ in shares],
        "patching_se": [se for _, se in shares],
        "patching_refused": refused,
        "interventions": log,
    }
    if estimated:
        labels = subject.head_labels()
        out["estimated"] = {
            "heads": [labels[h] for h in estimated],
            "exactly": [labels[h] for h in todo],
            "exact_flops": exact_flops,
            "bound_flops": bound,
            "method": "attribution patching: per context, the gradient of the NLL at the head's hook_z times "
                      "(mean - value) at the clean run, times (clean - corrupted value) at the corrupted run",
        }
    return out


@torch.no_grad()
def input_costs(subject, runs: Runs, bound: float = WORK_BOUND, named=()) -> dict | None:
    """Per head of the last layer, ``{q, k, v: cost, se, share, share_se}``, ``cost``, ``se`` and ``through``:
    the NLL change when every edge into that input carries its value on the corrupted contexts
    (``models.interp.circuit``'s receivers: the input then reads the corrupted run's residual, so its activation
    is the corrupted run's, patched in for that head alone), its share of the three inputs' summed cost
    (``cost``), with standard errors over the contexts (the shares None when that sum is not beyond 2 SE of
    zero: ``SENTENCES["share"]``); ``through`` is ``values``, ``keys/queries`` or None (no shares, or neither
    reached its bar). Exact runs stacked along the batch; when those of every last-layer head would take more
    than ``bound`` FLOPs, those of the heads in ``named`` (the carriers: the heads whose input the verdict
    reads) if they fit, and the others estimated by attribution patching (the gradient at the clean run times
    corrupted - clean), with ``estimated`` True. None for a family whose attention has no per-input hooks
    (CatFormer, Chen's and Edelman's models: no ``hook_q``, ``hook_k``, ``hook_v`` in the last layer): the
    circuit graph cuts each head's q, k and v apart."""
    receivers = last_layer_receivers(subject)
    if receivers is None:
        return None
    tokens, n, f = runs.tokens, len(runs.tokens), flops_per_context(subject)
    exact = receivers
    if len(receivers) * n * f > bound:
        exact = [r for r in receivers if r.node in named]
        exact = exact if len(exact) * n * f <= bound else []
    values = {r: _head_sum(runs.grad_clean[r.capture] * (runs.bad[r.capture] - runs.clean[r.capture]), r.head)
              for r in receivers if r not in exact}  # fmt: skip
    copies = [[Intervention(r.capture, "patch", heads=(r.head,), value=runs.bad[r.capture])] for r in exact]
    with progress_bar(desc="inspect: the inputs of the last layer's heads", total=len(copies) * n) as bar:
        if copies:
            lp = run_copies(subject, tokens, copies, runs.rows, bar)
            nll = runs.nll(lp.flatten(0, 1), tokens.repeat(len(copies), 1)).view(len(copies), n)
            values.update({r: nll[c] - runs.clean_values for c, r in enumerate(exact)})
    out = {}
    for label in dict.fromkeys(str(r.node) for r in receivers):
        costs = {r.input: values[r] for r in receivers if r.node == label}
        total = sum(costs.values())
        if not total.abs().max() > 0:  # nothing the corruption changes reaches it
            out[label] = {**{x: {"cost": 0.0, "se": 0.0, "share": None, "share_se": None} for x in INPUTS},
                          "cost": 0.0, "se": 0.0, "through": None}  # fmt: skip
            continue
        cost, se = mean_se(total)
        shares = beyond_2se(cost, se)  # a share of a cost within its standard errors of zero is no share
        head = {}
        for x, c in costs.items():
            share, share_se = ratio_se(c, total) if shares else (None, None)
            head[x] = {**dict(zip(("cost", "se"), mean_se(c))), "share": share, "share_se": share_se}
        head["cost"], head["se"] = cost, se
        head["through"] = (
            None if not shares
            else "values" if head["v"]["share"] >= th("values_share")
            else "keys/queries" if head["q"]["share"] + head["k"]["share"] >= th("select_share")
            else None
        )  # fmt: skip
        if any(r.node == label and r not in exact for r in receivers):
            head["estimated"] = True
        out[label] = head
    return out


def last_layer_receivers(subject) -> list | None:
    """The q, k, v receivers of the last layer's heads in the circuit graph (``build_graph``), in the graph's
    order; None for a family without the per-input hooks (``input_costs``)."""
    hooks, last = subject.model.hook_dict, subject.n_layers - 1
    if not all(f"blocks.{last}.attn.hook_{x}" in hooks for x in INPUTS):
        return None
    heads = {head_label(last, j) for j in range(subject.n_heads[last])}
    return [r for r in build_graph(subject).receivers if r.node in heads and r.input in INPUTS]


def corrupt(task, tokens, seed: int):
    """Same target sequence, demonstrations from a fresh tree (the corrupted run of issue 3)."""
    return corrupted_contexts(task, tokens, torch.Generator().manual_seed(seed + 7919))[0]


@torch.no_grad()
def inspect_subject(subject, n_contexts: int = 512, seed: int = 0, batch: int = 256, bound: float | None = None,
                    positions: str | None = None) -> dict:  # fmt: skip
    """Every number of the report (see the module docstring); ``bound``: the FLOPs a per-head stage may spend on
    exact runs (None: ``WORK_BOUND``; beyond it, attribution patching and the first-ranked heads exactly). NLL,
    progress, ablation, patching and sufficiency average over the target ``positions``
    (``probes.metrics.scored_rows``; default: those the subject was trained on, ``Subject.trained_on``): a model
    trained on the last token is judged on it."""
    bound = WORK_BOUND if bound is None else bound
    positions = subject.scored_positions(positions)
    n_contexts = check_int(n_contexts, "n_contexts", 2, MAX_CONTEXTS)  # 2: each number has a standard error
    check_contexts_fit(subject, n_contexts)  # as the command line's, before any context is drawn
    task = subject.task
    L, H = task.n_examples, task.seq_len
    tokens, parents = task.sample(n_contexts, torch.Generator().manual_seed(seed))
    order = context_order(task)  # 2 on a 3-gram: the generalized induction head matches two tokens
    base = baselines(task, tokens, parents, positions)  # BMA's and the plateau's predictions: once, for the SEs too
    fits = attention_rows(subject)
    batch = batch if fits >= batch else even_parts(n_contexts, fits)  # a big model: as many as fit, evenly
    lps, stats = [], None
    with progress_bar(desc="inspect: log-probs and attention", total=n_contexts) as bar:
        for i in range(0, n_contexts, batch):
            part_tokens, part_parents = tokens[i : i + batch], parents[i : i + batch]
            part_lp, layers = subject.log_probs_and_attention(part_tokens)
            lps.append(part_lp)
            part = []
            for att in layers:
                layer = head_attention_stats(
                    att.target_rows(L, H).cpu(), part_parents, base["posterior"][i : i + batch], L, H
                )
                prof = role_profile(att.pattern, att.query_predicts, att.key_token, part_parents, L)
                layer.update({f"role:{k}": v.tolist() for k, v in prof.items()})
                seq = sequence_scores(att.pattern, att.query_predicts, att.key_token, part_tokens, part_parents, H, order)
                layer.update({f"seq:{k}": v.tolist() for k, v in seq.items()})
                at = position_scores(att.pattern, att.query_predicts, att.key_token)
                layer.update({f"pos:{k}": v.nan_to_num(0.0).tolist() for k, v in at.items()})  # no row: 0 a part
                part.append(layer)
            del layers
            w = len(part_tokens) / n_contexts
            part = [{k: torch.tensor(v, dtype=torch.float64) * w for k, v in layer.items()} for layer in part]
            stats = part if stats is None else [{k: a[k] + b[k] for k in a} for a, b in zip(stats, part)]
            bar.update(len(part_tokens))
    lp = torch.cat(lps)
    nll = target_nll(lp, tokens, positions)
    per_head = []
    for i, layer in enumerate(stats):
        for j in range(subject.n_heads[i]):
            head = {"label": subject.head_labels()[len(per_head)]}
            head.update({k: v[j].tolist() for k, v in layer.items() if not k.startswith(("role:", "seq:", "pos:"))})
            head["role_profile"] = {k[5:]: v[j].tolist() for k, v in layer.items() if k.startswith("role:")}
            head["sequence"] = {k[4:]: v[j].item() for k, v in layer.items() if k.startswith("seq:")}
            head["position"] = position_summary({k[4:]: v[j] for k, v in layer.items() if k.startswith("pos:")})
            per_head.append(head)
    n_int = min(n_contexts, INTERVENTION_CONTEXTS)
    inter_tokens = tokens[:n_int]
    receivers = last_layer_receivers(subject) or []
    flops = flops_per_context(subject) * n_int
    grads = max(2 * sum(subject.n_heads), len(receivers)) * flops > bound  # a stage estimates: runs with gradients
    runs = record_runs(subject, inter_tokens, corrupt(task, inter_tokens, seed), sorted({r.capture for r in receivers}),
                       grads, positions)  # fmt: skip
    inter = interventions(subject, runs, bound)
    estimated = set(inter.get("estimated", {}).get("heads", ()))
    for h, a, se, p, p_se in zip(per_head, *(inter[k] for k in ("ablation_dnll", "ablation_se", "patching_restored",
                                                                 "patching_se"))):  # fmt: skip
        h.update(ablation_dnll=a, ablation_se=se, patching_restored=p, patching_se=p_se)
        if h["label"] in estimated:
            h["estimated"] = True  # a first-order estimate (beyond WORK_BOUND): never named a carrier
    out = {
        "kind": subject.family,
        "positions": positions,  # the target positions every NLL here averages over
        "trained_on": subject.trained_on,
        "nll": nll,
        **{k: v for k, v in base.items() if k not in ("posterior", "log_bayes", "log_plateau")},
        "heads": per_head,
        "n_contexts": n_contexts,
        "seed": seed,
        "intervention_contexts": n_int,
        "nll_clean": inter["nll_clean"],
        "nll_corrupted": inter["nll_corrupted"],
        "patching_refused": inter["patching_refused"],
        "interventions": inter["interventions"],
        "layout": layout_words(subject.layout),
        **verdict(nll, base, per_head, inter, *progress_errors(tokens, lp, base, positions)),
    }
    if "estimated" in inter:
        out["estimated"] = inter["estimated"]
    out["inputs"] = input_costs(subject, runs, bound, out["carriers"])
    for c in out["carriers"] if out["inputs"] else []:
        if out["inputs"].get(c, {}).get("through") == "values" and c not in out["parent_selecting"]:
            out["roles"][c] = f"{POOLING} ({out['roles'][c]})"
    for h in per_head:
        h["role"] = out["roles"][h["label"]]
    out["sequence_heads"] = sequence_heads(per_head)
    named = {"paper_circuit": sorted(set(out["parent_selecting"]) | set(out["copyers"])), "carriers": out["carriers"]}
    clean, plateau = runs.clean_values, runs.nll(base["log_plateau"][:n_int], inter_tokens)
    out["sufficiency"] = {}
    with progress_bar(desc="inspect: sufficiency", total=len(named)) as bar:
        for name, heads in named.items():
            if heads:
                out["sufficiency"][name] = sufficiency(subject, inter_tokens, heads, out["interventions"], clean, plateau,
                                                       positions)
            bar.update()
    # The paper's circuit is named only if its heads alone, every other head mean-ablated, keep the progress
    # (or they are every head: nothing else to ablate).
    suff = out["sufficiency"].get("paper_circuit", {})
    kept = suff.get("share")
    sufficient = (kept is not None and kept >= th("sufficient")) or (bool(suff) and not suff["ablated"])
    out["paper_circuit"] = out["paper_circuit_attention"] and sufficient
    return out


def attention_rows(subject) -> int:
    """Contexts a pass of ``log_probs_and_attention`` may take: its forward pass's own peak and every layer's
    pattern kept in float64 (measured on one context), a context each (``rows_per_pass``; 256 and more on the
    shipped models, about 60 on a GPT-2 small reading 42 positions)."""
    tokens, _ = subject.task.sample(1, torch.Generator().manual_seed(0))
    patterns = sum(a.pattern.numel() * a.pattern.element_size() for a in subject.log_probs_and_attention(tokens)[1])
    return rows_per_pass(forward_peak(subject)[1] + patterns, str(subject.model.cfg.device), factor=2.0)


def progress_errors(tokens, log_probs, base: dict, positions: str = "all") -> tuple[float, float]:
    """The standard errors over the contexts of the progress (delta method on per-context NLLs at ``positions``)
    and of the plateau-to-BMA gap it divides by, from the predictions of ``baselines`` (``base``) on the same
    contexts."""
    plateau, bayes = (per_context_nll(base[k], tokens, positions) for k in ("log_plateau", "log_bayes"))
    return ratio_se(plateau - per_context_nll(log_probs, tokens, positions), plateau - bayes)[1], mean_se(plateau - bayes)[1]


def layout_words(layout) -> str:
    """The layout a model is read with, as task.json's ``layout`` field writes it."""
    fields = {"bos": layout.bos, "sep": layout.sep, "token_offset": layout.token_offset}
    return "the task's own (no BOS, no separator, token_offset 0)" if layout.is_plain else json.dumps(fields)


@torch.no_grad()
def sufficiency(subject, tokens, heads: list[str], log: list, clean=None, plateau=None, positions: str = "all") -> dict:
    """The share of the model's progress over the uniform-parent plateau kept with every head NOT in
    ``heads`` (``ablated``) mean-ablated (its ``hook_z`` at the mean over ``tokens``), and its standard error
    over the contexts: ``(plateau - ablated) / (plateau - model)`` per-context means, delta method. No share
    (``share`` None, ``refused`` the reason: ``SENTENCES["sufficiency"]``) when no head is ablated, or when the
    model's gain over the plateau on ``tokens`` is not beyond 2 SE of zero. ``clean`` and ``plateau``: the
    model's and the plateau's per-context NLLs on ``tokens`` (at the target ``positions``), if the caller has them."""
    task = subject.task
    keep = set(heads)
    ablated = [head_label(i, j) for i, n in enumerate(subject.n_heads) for j in range(n) if head_label(i, j) not in keep]
    out = {"heads": sorted(keep), "ablated": ablated, "share": None, "se": None, "contexts": len(tokens), "refused": None}
    if not ablated:
        out["refused"] = "every head of the model is among them, so none is ablated: no sufficiency to measure"
        return out
    nll = partial(per_context_nll, tokens=tokens, positions=positions)
    plateau = nll(uniform_parent_predictive(task, tokens)) if plateau is None else plateau
    clean = nll(subject.log_probs(tokens)) if clean is None else clean
    gain = plateau - clean
    gain_mean, gain_se = mean_se(gain)
    if not beyond_2se(gain_mean, gain_se):
        out["refused"] = (f"the model's gain over the uniform-parent plateau on these contexts is {gain_mean:+.4f} +- "
                          f"{gain_se:.4f} nats, not beyond 2 SE of zero: a share of it would be a share of nothing")  # fmt: skip
        return out
    ivs = [head_ablation(subject, i, [j for j in range(n) if head_label(i, j) not in keep], "mean")
           for i, n in enumerate(subject.n_heads) if any(head_label(i, j) not in keep for j in range(n))]  # fmt: skip
    kept = plateau - nll(subject.log_probs(tokens, hooks(ivs, log)))
    out["share"], out["se"] = ratio_se(kept, gain)
    return out


# Heads named by what they read in the sequence (in-context Markov chains, fixed graphs) -------------------


def sequence_heads(heads: list[dict]) -> dict[str, list[str]]:
    """The heads named by ``probes.roles.sequence_scores``, each where its mass is >= ``sequence_mass`` and >=
    ``over_chance`` x its chance (``THRESHOLDS``; ``probes.roles.clears_chance``): PREVIOUS-TOKEN heads (mass on
    the token before the query's own), on an n-gram task K-BACK heads (``previous_k``: the token k before it),
    INDUCTION heads (mass on the tokens that followed earlier occurrences of the query's current token, on an
    n-gram task of its n - 1 last tokens), and OWN-PARENT heads (mass on the parents of the query's own token;
    a fixed graph's first layer). A previous-token head whose parents are all the previous token (a chain) is
    both."""

    backs = sorted((k for k in heads[0]["sequence"] if k.startswith("previous_") and k != "previous_token"
                    and not k.endswith("_chance")), key=lambda k: int(k.split("_")[1])) if heads else []  # fmt: skip
    named = {h["label"]: sequence_roles(h["sequence"]) for h in heads}
    return {k: [h for h, keys in named.items() if k in keys] for k in ("previous_token", *backs, "induction", "own_parent")}


def position_summary(scores: dict) -> dict:
    """A head's ``probes.roles.position_scores`` as the JSON keeps them: the sink, sequence-start and self masses
    with their chances; every offset's mass and chance (``offsets``, ``offsets_chance``: k = 1 .. K - 1, column
    k - 1); and the offset k >= 2 of most mass with its mass and chance (``best_offset``)."""
    out = {k: float(v) for k, v in scores.items() if not k.startswith("offsets")}
    offsets, chances = scores["offsets"], scores["offsets_chance"]
    out.update(offsets=offsets.tolist(), offsets_chance=chances.tolist())
    if (k := best_offset(offsets)) is not None:
        out.update(best_offset=k, best_offset_mass=float(offsets[k - 1]), best_offset_chance=float(chances[k - 1]))
    return out
