"""``analyses.inspect``'s measurement: every number its report prints, and the verdict's inputs, as one plain
dict (``inspect_subject``). Per head of every layer: the attention against the BMA posterior, copy mass, role
profile and sequence scores; mean-ablation cost and patching share, each with its standard error over the
contexts; the progress from the uniform-parent plateau to BMA with its standard error; the sufficiency of
the named heads (every other head mean-ablated); and through which input each last-layer head acts. The
verdict's rules and thresholds (``THRESHOLDS``, one table), and what each sentence of the report needs of the
numbers (``SENTENCES``: a share only of a denominator beyond 2 SE of zero), are ``analyses.inspect``'s docstring's; its
wording, the printed summary and the figures live there and only format this result."""

from __future__ import annotations

import json
from functools import partial

import torch

from models.interp.baselines import baselines, head_attention_stats
from models.interp.circuit import INPUTS, Runner, build_graph, mean_se, per_context_nll, ratio_se, sender_writes
from models.interp.interventions import ablate, corrupted_contexts, head_ablation, head_outputs, hooks, patch_heads
from models.interp.subject import head_label
from models.plumbing.progress import progress as progress_bar
from probes import target_nll
from probes.graph_task import context_order
from probes.oracles import uniform_parent_predictive
from probes.roles import attention_role, role_profile, sequence_scores

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
    "sequence_mass": (0.5, "a previous-token, induction or own-parent head puts this mass on its keys"),
    "induction_over_chance": (2.0, "an induction head puts this many times what uniform attention would"),
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
    """A share's denominator is worth dividing by: its mean beyond 2 standard errors of zero, positive, and
    more than float rounding (``SENTENCES["share"]``)."""
    return mean > 2 * se and mean > th("rounding")


POOLING = "evidence pooled through the values at fixed positions"


def costly(heads: list[dict]) -> list[str]:
    """The heads whose mean ablation costs more than ``cost_z`` standard errors, largest first."""
    order = sorted(heads, key=lambda h: -h["ablation_dnll"])
    return [h["label"] for h in order if h.get("ablation_se") is not None
            and h["ablation_dnll"] > th("cost_z") * h["ablation_se"]]  # fmt: skip


def carriers(heads: list[dict], gain: float) -> tuple[list[str], bool]:
    """The heads that carry the computation (``SENTENCES["carrier"]``), largest ablation first, and whether
    it is distributed (no single head reached the bar). Every head whose mean ablation costs more than
    ``cost_z`` standard errors is among them."""
    order = sorted(heads, key=lambda h: -h["ablation_dnll"])

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
    """Parent selector, copyer of demonstration l, or the role its attention profile shows."""
    if head["label"] in selecting:
        return "parent selector"
    if head["label"] in copyers:
        return f"copyer of demonstration {copyers[head['label']]}"
    return attention_role({k: torch.tensor(v) for k, v in head["role_profile"].items()})


@torch.no_grad()
def interventions(subject, tokens, corrupted, clean_lp=None, positions: str = "all") -> dict:
    """Per head: NLL change under mean ablation of its ``hook_z`` (mean over the contexts, with its standard
    error), and the share of the clean-vs-corrupted NLL difference restored by patching its clean ``hook_z``
    into the corrupted run, with its standard error (None for every head when that difference is below
    ``min_patch_effect`` or within 2 SE of zero: ``patching_refused`` says so). ``clean_lp``:
    ``subject.log_probs(tokens)``, if the caller has it. NLLs over the target ``positions``."""
    clean_z = head_outputs(subject, tokens)
    clean_lp = subject.log_probs(tokens) if clean_lp is None else clean_lp
    clean_values = per_context_nll(clean_lp, tokens, positions)
    corrupt_values = per_context_nll(subject.log_probs(corrupted), corrupted, positions)
    nll_clean, nll_corrupt = clean_values.mean().item(), corrupt_values.mean().item()
    effect, effect_se = mean_se(corrupt_values - clean_values)
    ablation, ablation_se, patching, patching_se, log = [], [], [], [], []
    jobs = [(i, j) for i, n in enumerate(subject.n_heads) for j in range(n)]
    # A share of nothing is no share: the demonstrations make no difference the contexts can resolve.
    refused = None
    if abs(effect) < th("min_patch_effect") or not beyond_2se(effect, effect_se):
        refused = (f"corrupting the demonstrations changes the NLL by {effect:+.4f} +- {effect_se:.4f} nats, not "
                   f"beyond 2 SE of zero and {th('min_patch_effect'):g} nats: no share of it to restore")  # fmt: skip
    for i, j in progress_bar(jobs, "ablate/patch heads", leave=False):
        ablated = subject.log_probs(tokens, ablate(subject, i, [j], "mean", log=log))
        cost, se = mean_se(per_context_nll(ablated, tokens, positions) - clean_values)
        ablation.append(cost)
        ablation_se.append(se)
        patched_lp = subject.log_probs(corrupted, patch_heads(subject, i, [j], clean_z, log))
        patched = per_context_nll(patched_lp, corrupted, positions)
        share, share_se = (None, None) if refused else ratio_se(corrupt_values - patched, corrupt_values - clean_values)
        patching.append(share)
        patching_se.append(share_se)
    return {
        "nll_clean": nll_clean,
        "nll_corrupted": nll_corrupt,
        "ablation_dnll": ablation,
        "ablation_se": ablation_se,
        "patching_restored": patching,
        "patching_se": patching_se,
        "patching_refused": refused,
        "interventions": log,
    }


@torch.no_grad()
def input_costs(subject, tokens, corrupted, positions: str = "all") -> dict | None:
    """Per head of the last layer, ``{q, k, v: cost, se, share, share_se}``, ``cost``, ``se`` and ``through``:
    the NLL change when every edge into that input carries its value on ``corrupted`` (``models.interp.circuit``,
    exact), its share of the three inputs' summed cost (``cost``), with standard errors over the contexts (the
    shares None when that sum is not beyond 2 SE of zero: ``SENTENCES["share"]``); ``through`` is ``values``,
    ``keys/queries`` or None (no shares, or neither reached its bar). None for a family whose attention has no
    per-input hooks (CatFormer, Chen's and Edelman's models: no ``hook_q``, ``hook_k``, ``hook_v`` in the last
    layer): the circuit graph cuts each head's q, k and v apart."""
    hooks, last = subject.model.hook_dict, subject.n_layers - 1
    if not all(f"blocks.{last}.attn.hook_{x}" in hooks for x in INPUTS):
        return None
    graph = build_graph(subject)
    runner = Runner(subject, graph, tokens, sender_writes(subject, graph, corrupted)[0],
                    partial(per_context_nll, positions=positions))
    out = {}
    for j in range(subject.n_heads[last]):
        label = head_label(last, j)
        costs = {x: runner.run_values([e for e in graph.edges if (e.receiver, e.input) == (label, x)])
                 - runner.clean_values for x in INPUTS}  # fmt: skip
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
        out[label] = head
    return out


def corrupt(task, tokens, seed: int):
    """Same target sequence, demonstrations from a fresh tree (the corrupted run of issue 3)."""
    return corrupted_contexts(task, tokens, torch.Generator().manual_seed(seed + 7919))[0]


@torch.no_grad()
def inspect_subject(subject, n_contexts: int = 512, seed: int = 0, batch: int = 256, positions: str | None = None) -> dict:
    """Every number of the report (see the module docstring). NLL, progress, ablation, patching and
    sufficiency average over the target ``positions`` (``probes.metrics.scored_rows``; default: those the
    subject was trained on, ``Subject.trained_on``): a model trained on the last token is judged on it."""
    positions = positions or subject.trained_on
    stages = progress_bar(desc="inspect", total=4)  # off a terminal a line every 30 s, whichever stage runs
    stages.set_postfix(stage="attention")
    task = subject.task
    L, H = task.n_examples, task.seq_len
    tokens, parents = task.sample(n_contexts, torch.Generator().manual_seed(seed))
    order = context_order(task)  # 2 on a 3-gram: the generalized induction head matches two tokens
    base = baselines(task, tokens, parents, positions)  # BMA's and the plateau's predictions: once, for the SEs too
    lp = torch.cat([subject.log_probs(tokens[i : i + batch]) for i in range(0, n_contexts, batch)])
    nll = target_nll(lp, tokens, positions)
    stats = None
    for i in range(0, n_contexts, batch):
        part_tokens, part_parents = tokens[i : i + batch], parents[i : i + batch]
        part = []
        for att in subject.attention(part_tokens):
            layer = head_attention_stats(
                att.target_rows(L, H).cpu(), part_parents, base["posterior"][i : i + batch], L, H
            )
            prof = role_profile(att.pattern, att.query_predicts, att.key_token, part_parents, L)
            layer.update({f"role:{k}": v.tolist() for k, v in prof.items()})
            seq = sequence_scores(att.pattern, att.query_predicts, att.key_token, part_tokens, part_parents, H, order)
            layer.update({f"seq:{k}": v.tolist() for k, v in seq.items()})
            part.append(layer)
        w = len(part_tokens) / n_contexts
        part = [{k: torch.tensor(v, dtype=torch.float64) * w for k, v in layer.items()} for layer in part]
        stats = part if stats is None else [{k: a[k] + b[k] for k in a} for a, b in zip(stats, part)]
    per_head = []
    for i, layer in enumerate(stats):
        for j in range(subject.n_heads[i]):
            head = {"label": subject.head_labels()[len(per_head)]}
            head.update({k: v[j].tolist() for k, v in layer.items() if not k.startswith(("role:", "seq:"))})
            head["role_profile"] = {k[5:]: v[j].tolist() for k, v in layer.items() if k.startswith("role:")}
            head["sequence"] = {k[4:]: v[j].item() for k, v in layer.items() if k.startswith("seq:")}
            per_head.append(head)
    n_int = min(n_contexts, INTERVENTION_CONTEXTS)
    inter_tokens = tokens[:n_int]
    stages.update()
    stages.set_postfix(stage="ablation and patching")
    inter_corrupted = corrupt(task, inter_tokens, seed)
    inter_clean = subject.log_probs(inter_tokens)  # the clean run of every intervention below, once
    inter = interventions(subject, inter_tokens, inter_corrupted, inter_clean, positions)
    for h, a, se, p, p_se in zip(per_head, *(inter[k] for k in ("ablation_dnll", "ablation_se", "patching_restored",
                                                                 "patching_se"))):  # fmt: skip
        h.update(ablation_dnll=a, ablation_se=se, patching_restored=p, patching_se=p_se)
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
    stages.update()
    stages.set_postfix(stage="inputs of the last layer")
    out["inputs"] = input_costs(subject, inter_tokens, inter_corrupted, positions)
    for c in out["carriers"] if out["inputs"] else []:
        if out["inputs"].get(c, {}).get("through") == "values" and c not in out["parent_selecting"]:
            out["roles"][c] = f"{POOLING} ({out['roles'][c]})"
    for h in per_head:
        h["role"] = out["roles"][h["label"]]
    out["sequence_heads"] = sequence_heads(per_head)
    named = {"paper_circuit": sorted(set(out["parent_selecting"]) | set(out["copyers"])), "carriers": out["carriers"]}
    stages.update()
    stages.set_postfix(stage="sufficiency")
    clean = per_context_nll(inter_clean, inter_tokens, positions)
    plateau = per_context_nll(base["log_plateau"][:n_int], inter_tokens, positions)
    out["sufficiency"] = {
        name: sufficiency(subject, inter_tokens, heads, out["interventions"], clean, plateau, positions)
        for name, heads in named.items()
        if heads
    }
    # The paper's circuit is named only if its heads alone, every other head mean-ablated, keep the progress
    # (or they are every head: nothing else to ablate).
    suff = out["sufficiency"].get("paper_circuit", {})
    kept = suff.get("share")
    sufficient = (kept is not None and kept >= th("sufficient")) or (bool(suff) and not suff["ablated"])
    out["paper_circuit"] = out["paper_circuit_attention"] and sufficient
    stages.update()
    stages.close()
    return out


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
    """The heads named by ``probes.roles.sequence_scores``: PREVIOUS-TOKEN heads (mass on the token
    before the query's own >= ``sequence_mass`` (``THRESHOLDS``)), on an n-gram task K-BACK heads (``previous_k``: mass on the
    token k before it), INDUCTION heads (mass on the tokens that followed earlier occurrences of the query's
    current token, on an n-gram task of its n - 1 last tokens, >= ``sequence_mass`` (``THRESHOLDS``) and >=
    ``induction_over_chance`` x chance), and OWN-PARENT heads (mass on the parents of the query's own token
    >= ``sequence_mass`` (``THRESHOLDS``); a fixed graph's first layer). A previous-token head whose parents are all the
    previous token (a chain) is both."""

    def at_least(h: dict, key: str) -> bool:
        v = h["sequence"][key]
        return v == v and v >= th("sequence_mass")

    backs = sorted((k for k in heads[0]["sequence"] if k.startswith("previous_") and k != "previous_token"),
                   key=lambda k: int(k.split("_")[1])) if heads else []  # fmt: skip
    return {
        **{k: [h["label"] for h in heads if at_least(h, k)] for k in ("previous_token", *backs)},
        "induction": [
            h["label"] for h in heads
            if at_least(h, "induction") and h["sequence"]["induction"] >= th("induction_over_chance") * h["sequence"]["induction_chance"]
        ],
        "own_parent": [h["label"] for h in heads if at_least(h, "own_parent")],
    }  # fmt: skip
