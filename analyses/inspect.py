"""Inspect any supported model: what does each head do, which heads carry the computation, and is it
the paper's copy-then-select circuit?

    python -m analyses.inspect                                   # the shipped checkpoint
    python -m analyses.inspect --checkpoint standard             # the shipped standard GPT-2
    python -m analyses.inspect --checkpoint w.pt --config cfg.json --key-map map.json

For every head of every layer (``Subject.attention``): the attention from the query that predicts x_h
of the target over the target's candidate parents (h' < h), renormalised over them, against the BMA
posterior (TV, parent accuracy); its mass on the candidates; its attention to position h of each
demonstration (copy behaviour); its ROLE PROFILE (``probes.roles``): the attention mass, from every
query that predicts a task token (demonstration queries and target queries apart), on the same
sequence's earlier positions, on the query's own position, on the same position of other sequences,
on other positions of other sequences, on the candidate parents and on the true parent; and its CAUSAL
WEIGHT: mean-ablation of its output (``hook_z``; NLL change) and clean->corrupted patching (share of
the clean-vs-corrupted NLL difference it restores).

Two baselines on the same contexts: BMA, and the uniform-parent mixture (attention spread evenly over
the candidates, BMA with no demonstration: the plateau at initialisation). Verdict rules:
- ``progress = (NLL_uniform - NLL) / (NLL_uniform - NLL_BMA)``; the model is ON THE PLATEAU if
  progress < 0.5 (its NLL is closer to the plateau than to BMA), WORSE THAN THE PLATEAU if its NLL is
  above the uniform-parent mixture's (by more than 1e-6 nats, float rounding). Then no head is credited. If BMA is
  within 0.005 nats of the plateau on the sampled contexts, no verdict is possible (``on_plateau`` None).
- Otherwise a head is PARENT-SELECTING if its candidate mass >= 0.5, its parent accuracy closes at
  least half the gap from the uniform baseline to BMA, and its TV to BMA is below the uniform's.
- A head is a COPYER of demonstration l if its attention to position h of demonstration l, averaged
  over h, is >= 0.5.
- The PAPER'S CIRCUIT is recognised when there are copyers and a parent-selecting head.
- Off the plateau, the heads that CARRY the computation are those whose mean ablation costs at least
  a tenth of the model's gain over the plateau, or whose patching restores at least a tenth of the
  clean-vs-corrupted difference (if none does, the three largest by ablation, reported as distributed).
  Each is named with its role: parent selector, copyer of demonstration l, or the category holding at
  least half its attention (``probes.roles.ROLE_NAMES``: within-sequence (prefix) head, cross-
  demonstration same-position reader, ...).
- Heads named by what they read in the sequence (``sequence_heads``; ``probes.roles.sequence_scores``):
  previous-token heads and induction heads (in-context Markov chains), heads on the parent of the query's
  own token (a fixed graph).
- THROUGH WHICH INPUT each head of the last layer acts (``input_costs``): the metric's change when every
  edge into its query, key or value input (every sender, every position: per-input path patching of
  ``models.interp.circuit``) carries the corrupted run's value, and each input's share of their sum, with
  standard errors. A carrier whose value input takes at least 0.8 of it, its attention nearly content-free,
  is named for the mechanism: EVIDENCE POOLED THROUGH THE VALUES AT FIXED POSITIONS; one whose query and
  key inputs take at least half SELECTS THROUGH ITS KEYS/QUERIES (the paper's parent selector does).
The report links to the discovered circuit (``python -m analyses.circuit``), whose edges are the
mechanism; ``inspect``'s head names are its summary.
"""

from __future__ import annotations

import json

import torch
from tqdm.auto import tqdm

from analyses import common
from models.interp.baselines import baselines, head_attention_stats
from models.interp.circuit import INPUTS, Runner, build_graph, mean_se, per_context_nll, ratio_se, sender_writes
from models.interp.interventions import ablate, corrupted_contexts, head_ablation, head_outputs, hooks, patch_heads
from models.interp.subject import head_label
from models.training.standard import uniform_parent_predictive
from probes import target_nll
from probes.graph_task import context_order
from probes.roles import CATEGORIES, GROUPS, OVERLAPPING, attention_role, role_profile, sequence_scores

NAME = "inspect"
N_CONTEXTS = 512  # default --n-contexts
FIGURES = {
    "inspect_heads.png": (
        "per head of every layer of the inspected model: parent accuracy, TV to the BMA posterior and mass on the candidate parents from the query that predicts x_h, against BMA and the uniform-parent baseline, with the verdict in the title."
    ),
    "inspect_copy.png": (
        "attention from the query predicting x_h to position h of each demonstration, per head (copy behaviour)."
    ),
    "inspect_interventions.png": (
        "NLL change from mean-ablating each head, and the share of the clean-vs-corrupted difference restored by patching it."
    ),
    "inspect_roles.png": (
        "role profile per head: attention mass by key category relative to the query (same sequence earlier, itself, same position of other sequences, other positions, candidate parents, true parent), from demonstration and from target queries, beside its causal weight; the heads that carry the computation are named with their roles."
    ),
}


PLATEAU_PROGRESS = 0.5  # progress below this: on the plateau
SELECT_FRACTION = 0.5  # a head must close this fraction of the uniform -> BMA parent-accuracy gap
MIN_CANDIDATE_MASS = 0.5
COPY_MASS = 0.5
MIN_PLATEAU_GAP = 0.005  # nats between plateau and BMA below which no verdict is possible
WORSE_MARGIN = 1e-6  # nats above the plateau's NLL (beyond float rounding): worse than the plateau
MIN_PATCH_EFFECT = 0.005  # nats between clean and corrupted runs for patching to be defined
CARRY_FRACTION = 0.1  # a carrying head's ablation costs this share of the gain over the plateau (or its
# patching restores this share of the clean-vs-corrupted difference)
N_DISTRIBUTED = 3  # heads named when no single head reaches the carrying bar
VALUES_SHARE = 0.8  # a last-layer head whose value input carries this share of its inputs' cost pools
# evidence through its values (its attention is nearly content-free)
SELECT_SHARE = 0.5  # ... whose query and key inputs carry this share: it selects through its keys/queries
POOLING = "evidence pooled through the values at fixed positions"


def carriers(heads: list[dict], gain: float, nll_clean: float, nll_corrupted: float) -> tuple[list[str], bool]:
    """The heads that carry the computation (module docstring), largest ablation first, and whether it
    is distributed (no single head reached the bar)."""
    order = sorted(heads, key=lambda h: -h["ablation_dnll"])
    patch_bar = abs(nll_corrupted - nll_clean) >= MIN_PATCH_EFFECT
    chosen = [
        h["label"]
        for h in order
        if h["ablation_dnll"] >= CARRY_FRACTION * gain
        or (patch_bar and h["patching_restored"] is not None and h["patching_restored"] >= CARRY_FRACTION)
    ]
    if chosen:
        return chosen, False
    return [h["label"] for h in order[:N_DISTRIBUTED]], True


def verdict(nll: float, base: dict, heads: list[dict], inter: dict | None = None) -> dict:
    """Apply the module docstring's rules; ``heads`` hold candidate_mass, tv, parent_acc, copy_mass,
    role_profile, and (with ``inter``, the clean and corrupted NLLs) ablation_dnll, patching_restored."""
    gap = base["nll_uniform"] - base["nll_bma"]
    if gap < MIN_PLATEAU_GAP:  # the demonstrations barely help even BMA here: nothing to credit
        progress, on_plateau = None, None
    else:
        progress = (base["nll_uniform"] - nll) / gap
        on_plateau = progress < PLATEAU_PROGRESS
    bar = base["acc_uniform"] + SELECT_FRACTION * (base["acc_bma"] - base["acc_uniform"])
    selecting = [
        h["label"]
        for h in heads
        if on_plateau is False
        and h["candidate_mass"] >= MIN_CANDIDATE_MASS
        and h["parent_acc"] >= bar
        and h["tv"] < base["tv_uniform"]
    ]
    copyers = {
        h["label"]: int(torch.tensor(h["copy_mass"]).argmax())
        for h in heads
        if max(h["copy_mass"], default=0) >= COPY_MASS
    }
    best = max(heads, key=lambda h: h["parent_acc"])["label"]
    roles = {h["label"]: head_role(h, selecting, copyers) for h in heads}
    carrying, distributed = [], False
    if on_plateau is False and inter is not None:
        carrying, distributed = carriers(heads, base["nll_uniform"] - nll, inter["nll_clean"], inter["nll_corrupted"])
    return {
        "progress": progress,
        "on_plateau": on_plateau,
        "worse_than_plateau": progress is not None and nll - base["nll_uniform"] > WORSE_MARGIN,
        "parent_acc_bar": bar,
        "parent_selecting": selecting,
        "copyers": copyers,
        "best_head": best,
        "paper_circuit": on_plateau is False and bool(selecting) and bool(copyers),
        "roles": roles,
        "carriers": carrying,
        "carriers_distributed": distributed,
    }


def head_role(head: dict, selecting: list[str], copyers: dict[str, int]) -> str:
    """Parent selector, copyer of demonstration l, or the role its attention profile shows."""
    if head["label"] in selecting:
        return "parent selector"
    if head["label"] in copyers:
        return f"copyer of demonstration {copyers[head['label']]}"
    return attention_role({k: torch.tensor(v) for k, v in head["role_profile"].items()})


@torch.no_grad()
def interventions(subject, tokens, corrupted) -> dict:
    """Per head: NLL change under mean ablation of its ``hook_z``, and the fraction of the clean-vs-
    corrupted NLL difference restored by patching its clean ``hook_z`` into the corrupted run."""
    clean_z = head_outputs(subject, tokens)
    nll_clean = target_nll(subject.log_probs(tokens), tokens)
    nll_corrupt = target_nll(subject.log_probs(corrupted), corrupted)
    ablation, patching, log = [], [], []
    jobs = [(i, j) for i, n in enumerate(subject.n_heads) for j in range(n)]
    # Undefined when the demonstrations make no difference (a model on the plateau): None.
    usable = abs(nll_corrupt - nll_clean) >= MIN_PATCH_EFFECT
    for i, j in tqdm(jobs, desc="ablate/patch heads", leave=False, disable=len(jobs) < 8):
        ablation.append(
            target_nll(subject.log_probs(tokens, ablate(subject, i, [j], "mean", log=log)), tokens) - nll_clean
        )
        patched = target_nll(subject.log_probs(corrupted, patch_heads(subject, i, [j], clean_z, log)), corrupted)
        patching.append((nll_corrupt - patched) / (nll_corrupt - nll_clean) if usable else None)
    return {
        "nll_clean": nll_clean,
        "nll_corrupted": nll_corrupt,
        "ablation_dnll": ablation,
        "patching_restored": patching,
        "interventions": log,
    }


@torch.no_grad()
def input_costs(subject, tokens, corrupted) -> dict | None:
    """Per head of the last layer, ``{q, k, v: cost, se, share, share_se}`` and ``through``: the NLL change
    when every edge into that input carries its value on ``corrupted`` (``models.interp.circuit``, exact), its share
    of the three inputs' summed cost (``cost``), with standard errors over the contexts; ``through`` is
    ``values``, ``keys/queries`` or None (no verdict: that sum within two standard errors of zero, or
    neither share reached). None when the model lacks a hook the circuit graph needs."""
    try:
        graph = build_graph(subject)
    except ValueError:
        return None
    runner = Runner(subject, graph, tokens, sender_writes(subject, graph, corrupted)[0])
    last = subject.n_layers - 1
    out = {}
    for j in range(subject.n_heads[last]):
        label = head_label(last, j)
        costs = {x: runner.run_values([e for e in graph.edges if (e.receiver, e.input) == (label, x)])
                 - runner.clean_values for x in INPUTS}  # fmt: skip
        total = sum(costs.values())
        if not total.abs().max() > 0:  # nothing the corruption changes reaches it
            out[label] = {**{x: {"cost": 0.0, "se": 0.0, "share": None, "share_se": None} for x in INPUTS},
                          "through": None}  # fmt: skip
            continue
        head = {}
        for x, c in costs.items():
            cost, se = mean_se(c)
            share, share_se = ratio_se(c, total)
            head[x] = {"cost": cost, "se": se, "share": share, "share_se": share_se}
        selecting = head["q"]["share"] + head["k"]["share"]
        cost, se = mean_se(total)
        head["cost"], head["se"] = cost, se
        head["through"] = (  # no verdict for a cost within two standard errors of zero
            None if cost <= 2 * se
            else "values" if head["v"]["share"] >= VALUES_SHARE
            else "keys/queries" if selecting >= SELECT_SHARE
            else None
        )  # fmt: skip
        out[label] = head
    return out


def through_words(label: str, inputs: dict) -> str:
    """``L1H0: v 0.99 +- 0.01, k 0.00 +- 0.00, q 0.00 +- 0.00 of its inputs' cost (0.153 +- 0.010 nats)``."""
    h = inputs[label]
    if h["v"]["share"] is None:
        return f"{label}: no cost (nothing the corruption changes reaches its inputs)"
    shares = ", ".join(f"{x} {h[x]['share']:.2f} +- {h[x]['share_se']:.2f}" for x in ("v", "k", "q"))
    return f"{label}: {shares} of its inputs' cost ({h['cost']:.3f} +- {h['se']:.3f} nats)"


def corrupt(task, tokens, seed: int):
    """Same target sequence, demonstrations from a fresh tree (the corrupted run of issue 3)."""
    return corrupted_contexts(task, tokens, torch.Generator().manual_seed(seed + 7919))[0]


@torch.no_grad()
def inspect_subject(subject, n_contexts: int = 512, seed: int = 0, batch: int = 256) -> dict:
    """Every number of the report (see the module docstring)."""
    task = subject.task
    L, H = task.n_examples, task.seq_len
    tokens, parents = common.sample_contexts(task, n_contexts, seed)
    order = context_order(task)  # 2 on a 3-gram: the generalized induction head matches two tokens
    base = baselines(task, tokens, parents)
    lp = torch.cat([subject.log_probs(tokens[i : i + batch]) for i in range(0, n_contexts, batch)])
    nll = target_nll(lp, tokens)
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
    n_int = min(n_contexts, 128)
    inter = interventions(subject, tokens[:n_int], corrupt(task, tokens[:n_int], seed))
    for h, a, p in zip(per_head, inter["ablation_dnll"], inter["patching_restored"]):
        h.update(ablation_dnll=a, patching_restored=p)
    out = {
        "kind": subject.family,
        "nll": nll,
        **{k: v for k, v in base.items() if k != "posterior"},
        "heads": per_head,
        "intervention_contexts": n_int,
        "nll_clean": inter["nll_clean"],
        "nll_corrupted": inter["nll_corrupted"],
        "interventions": inter["interventions"],
        **verdict(nll, base, per_head, inter),
    }
    out["inputs"] = input_costs(subject, tokens[:n_int], corrupt(task, tokens[:n_int], seed))
    for c in out["carriers"] if out["inputs"] else []:
        if out["inputs"].get(c, {}).get("through") == "values" and c not in out["parent_selecting"]:
            out["roles"][c] = f"{POOLING} ({out['roles'][c]})"
    for h in per_head:
        h["role"] = out["roles"][h["label"]]
    out["sequence_heads"] = sequence_heads(per_head)
    named = {"paper_circuit": sorted(set(out["parent_selecting"]) | set(out["copyers"])), "carriers": out["carriers"]}
    out["sufficiency"] = {
        name: sufficiency(subject, tokens[:n_int], heads, out["interventions"])
        for name, heads in named.items()
        if heads
    }
    return out


@torch.no_grad()
def sufficiency(subject, tokens, heads: list[str], log: list) -> dict:
    """The share of the model's progress over the uniform-parent plateau kept with every head NOT in
    ``heads`` mean-ablated (its ``hook_z`` at the mean over ``tokens``), and its standard error over
    the contexts: ``(plateau - ablated) / (plateau - model)`` per-context means, delta method."""
    task = subject.task
    keep = set(heads)
    ivs = [head_ablation(subject, i, [j for j in range(n) if head_label(i, j) not in keep], "mean")
           for i, n in enumerate(subject.n_heads) if any(head_label(i, j) not in keep for j in range(n))]  # fmt: skip
    plateau = uniform_parent_predictive(task, tokens)
    nll = lambda lp: per_context_nll(lp, tokens)  # noqa: E731
    share, se = ratio_se(nll(plateau) - nll(subject.log_probs(tokens, hooks(ivs, log))),
                         nll(plateau) - nll(subject.log_probs(tokens)))  # fmt: skip
    return {"heads": sorted(keep), "share": share, "se": se, "contexts": len(tokens)}


# Heads named by what they read in the sequence (in-context Markov chains, fixed graphs) -------------------
SEQUENCE_MASS = 0.5  # a previous-token, induction or own-parent head puts at least this on its keys
INDUCTION_OVER_CHANCE = 2.0  # and an induction head at least this many times what uniform attention would


def sequence_heads(heads: list[dict]) -> dict[str, list[str]]:
    """The heads named by ``probes.roles.sequence_scores``: PREVIOUS-TOKEN heads (mass on the token
    before the query's own >= ``SEQUENCE_MASS``), on an n-gram task K-BACK heads (``previous_k``: mass on the
    token k before it), INDUCTION heads (mass on the tokens that followed earlier occurrences of the query's
    current token, on an n-gram task of its n - 1 last tokens, >= ``SEQUENCE_MASS`` and >=
    ``INDUCTION_OVER_CHANCE`` x chance), and OWN-PARENT heads (mass on the parents of the query's own token
    >= ``SEQUENCE_MASS``; a fixed graph's first layer). A previous-token head whose parents are all the
    previous token (a chain) is both."""

    def at_least(h: dict, key: str) -> bool:
        v = h["sequence"][key]
        return v == v and v >= SEQUENCE_MASS

    backs = sorted((k for k in heads[0]["sequence"] if k.startswith("previous_") and k != "previous_token"),
                   key=lambda k: int(k.split("_")[1])) if heads else []  # fmt: skip
    return {
        **{k: [h["label"] for h in heads if at_least(h, k)] for k in ("previous_token", *backs)},
        "induction": [
            h["label"] for h in heads
            if at_least(h, "induction") and h["sequence"]["induction"] >= INDUCTION_OVER_CHANCE * h["sequence"]["induction_chance"]
        ],
        "own_parent": [h["label"] for h in heads if at_least(h, "own_parent")],
    }  # fmt: skip


def sequence_text(r: dict) -> list[str]:
    """One line per kind of sequence head, with each head's mass (and the induction chance level)."""
    by_label = {h["label"]: h["sequence"] for h in r["heads"]}
    order = sum(1 for k in r["sequence_heads"] if k.startswith("previous_"))
    induction = "induction heads" if order == 1 else f"generalized induction heads ({order} tokens matched)"
    words = {"previous_token": "previous-token heads", "induction": induction, "own_parent": "own-parent heads"}
    lines = []
    for kind, labels in r["sequence_heads"].items():
        chance = {"induction": "induction_chance", "own_parent": "own_parent_chance"}.get(kind)
        found = ", ".join(
            f"{x} ({by_label[x][kind]:.2f}" + (f", chance {by_label[x][chance]:.2f})" if chance else ")")
            for x in labels
        )  # fmt: skip
        word = words.get(kind) or f"{kind.split('_')[1]}-back heads (the token {kind.split('_')[1]} before)"
        lines.append(f"{word}: {found or 'none'}")
    return lines


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def circuit_text(r: dict) -> str:
    """The verdict in words: plateau, the paper's circuit, or the heads that carry the computation."""
    if r["on_plateau"] is None:
        return (
            f"BMA is within {MIN_PLATEAU_GAP} nats of the uniform-parent plateau on these contexts, so no head "
            f"can be credited (use more contexts or demonstrations)"
        )
    if r["on_plateau"]:
        where = (
            f"WORSE THAN THE UNIFORM-PARENT PLATEAU (its NLL is {r['nll'] - r['nll_uniform']:.4f} nats above the "
            f"uniform-parent mixture's)"
            if r["worse_than_plateau"]
            else "ON THE UNIFORM-PARENT PLATEAU"
        )
        return f"{where}: no head credited (best head {r['best_head']} is not evidence of a mechanism)"
    by_label = {h["label"]: h for h in r["heads"]}
    named = "; ".join(
        f"{c} ({r['roles'][c]}: ablation {by_label[c]['ablation_dnll']:+.4f} nats, patching "
        f"{_fmt(by_label[c]['patching_restored'])})"
        for c in r["carriers"]
    )
    carried = ("no single head carries it; the largest causal weights: " if r["carriers_distributed"] else "") + named
    if r["paper_circuit"]:
        copy = ", ".join(f"{k}->demo {v}" for k, v in r["copyers"].items())
        return (
            f"THE PAPER'S CIRCUIT: copyers {copy}, then parent selection by {', '.join(r['parent_selecting'])}. "
            f"Carrying the computation: {carried}"
        )
    missing = [
        w
        for w, present in (("no parent-selecting head", r["parent_selecting"]), ("no copyer", r["copyers"]))
        if not present
    ]
    return f"off the plateau, and the paper's circuit is absent ({', '.join(missing)}). Carrying the computation: {carried}"


def plateau_words(r: dict) -> str:
    """Where a model below the bar stands, for figure titles."""
    return "worse than the uniform-parent plateau" if r["worse_than_plateau"] else "on the uniform-parent plateau"


def summary(r: dict) -> str:
    lines = [
        f"{'':16s}{'NLL':>8s}{'gap':>9s}{'parent acc':>12s}{'TV to BMA':>11s}",
        f"{'model':16s}{r['nll']:8.4f}{r['nll'] - r['nll_bma']:+9.4f}{'':>12s}{'':>11s}",
        f"{'BMA':16s}{r['nll_bma']:8.4f}{0:+9.4f}{r['acc_bma']:12.3f}{0:11.3f}",
        (
            f"{'uniform-parent':16s}{r['nll_uniform']:8.4f}{r['nll_uniform'] - r['nll_bma']:+9.4f}"
            f"{r['acc_uniform']:12.3f}{r['tv_uniform']:11.3f}"
        ),
        "",
        (
            f"{'head':6s}{'cand mass':>10s}{'TV':>7s}{'parent acc':>11s}{'max copy':>9s}{'ablate dNLL':>12s}"
            f"{'patch':>7s}  role"
        ),
    ]
    for h in r["heads"]:
        lines.append(
            f"{h['label']:6s}{h['candidate_mass']:10.3f}{h['tv']:7.3f}{h['parent_acc']:11.3f}"
            f"{max(h['copy_mass'], default=float('nan')):9.3f}{h['ablation_dnll']:+12.4f}{_fmt(h['patching_restored']):>7s}  {h['role']}"
        )
    lines += ["", "role profile: attention mass from demonstration / target queries"]
    lines.append(f"{'head':6s}" + "".join(f"{c[:13]:>14s}" for c in CATEGORIES))
    for h in r["heads"]:
        cells = (h["role_profile"][c] for c in CATEGORIES)
        lines.append(f"{h['label']:6s}" + "".join(f"{_pair(v):>14s}" for v in cells))
    lines.append("")
    if r["on_plateau"] is not None:
        lines.append(f"{r['kind']} model: progress from the plateau to BMA {r['progress']:.3f}")
    lines.append(circuit_text(r))
    if r["on_plateau"] is False:
        lines.append(
            f"paper's circuit, parent-selecting heads: {', '.join(r['parent_selecting']) or 'not found'} "
            f"(bar: parent acc >= {r['parent_acc_bar']:.3f})"
        )
    copyers = ", ".join(f"{k}->demo {v}" for k, v in r["copyers"].items())
    lines.append(
        "paper's circuit, copyers: " + (copyers or "not found (no head puts >= 0.5 on position h of one demonstration)")
    )
    for name, suff in r.get("sufficiency", {}).items():
        lines.append(
            f"sufficiency of the {name.replace('_', ' ')} ({', '.join(suff['heads'])}): every other head mean-ablated "
            f"keeps {suff['share']:.3f} +- {suff['se']:.3f} of the progress ({suff['contexts']} contexts)"
        )
    if r.get("inputs"):
        lines.append(
            "through which input each last-layer head acts (every edge into it patched from the corrupted run, "
            f"{r['intervention_contexts']} contexts):"
        )
        for label, h in r["inputs"].items():
            verdict_ = {"values": POOLING, "keys/queries": "selects through its keys/queries"}.get(h["through"], "")
            lines.append(f"  {through_words(label, r['inputs'])}{'  -> ' + verdict_ if verdict_ else ''}")
    lines += sequence_text(r)
    link = r.get("circuit_link")
    if link:
        lines.append(f"the discovered circuit (the edges between these heads): {link['json']} ({link['command']})")
    return "\n".join(lines)


def circuit_link(checkpoint: str | None, digest: str) -> dict:
    """Where ``analyses.circuit`` writes (or, for the shipped standard GPT-2, has written) this model's
    circuit: the committed ``figures/circuit.json`` when its checkpoint hash is this model's, else the
    folder ``python -m analyses.circuit --checkpoint X`` writes by default."""
    command = "python -m analyses.circuit" + ("" if checkpoint is None else f" --checkpoint {checkpoint}")
    committed = common.FIGURES_DIR / "circuit.json"
    try:
        if json.loads(committed.read_text()).get("checkpoint_hash") == digest:
            return {"command": command, "json": "figures/circuit.json"}
    except (OSError, ValueError):
        pass
    return {"command": command, "json": str(common.default_out(checkpoint) / "circuit.json")}


def _pair(v: list[float]) -> str:
    return "/".join("-" if x != x else f"{x:.2f}" for x in v)


def figures(r: dict, args) -> dict:
    import matplotlib.pyplot as plt
    import numpy as np

    n = args.n_contexts
    labels = [h["label"] for h in r["heads"]]
    x = np.arange(len(labels))
    verdict_text = (
        "no verdict (BMA ~ plateau)"
        if r["on_plateau"] is None
        else plateau_words(r)
        if r["on_plateau"]
        else f"parent-selecting: {', '.join(r['parent_selecting']) or 'none'}"
    )
    out = {}
    fig, axes = plt.subplots(1, 3, figsize=(max(9, 0.5 * len(labels) + 6), 3.4))
    axes[0].bar(x, [h["parent_acc"] for h in r["heads"]], color="C0")
    axes[0].axhline(r["acc_bma"], color="k", label="BMA")
    axes[0].axhline(r["acc_uniform"], color="C3", ls="--", label="uniform-parent")
    axes[0].set(ylabel="parent accuracy", title="argmax = true parent")
    axes[1].bar(x, [h["tv"] for h in r["heads"]], color="C1")
    axes[1].axhline(r["tv_uniform"], color="C3", ls="--", label="uniform-parent")
    axes[1].set(ylabel="TV to BMA posterior", title="candidate attention vs BMA")
    axes[2].bar(x, [h["candidate_mass"] for h in r["heads"]], color="C2")
    axes[2].set(ylabel="attention mass", title="mass on candidate parents", ylim=(0, 1.02))
    for ax in axes:
        ax.set_xticks(x, labels, rotation=90, fontsize=7)
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"{r['kind']} model, {n} contexts: NLL gap to BMA {r['nll'] - r['nll_bma']:+.4f} "
        f"(plateau {r['nll_uniform'] - r['nll_bma']:+.4f}); {verdict_text}",
        fontsize=9,
    )
    out["inspect_heads"] = fig

    copy = np.array([h["copy_mass"] for h in r["heads"]])
    fig, ax = plt.subplots(figsize=(0.45 * copy.shape[1] + 2.5, 0.3 * len(labels) + 1.5))
    ax.set(title=f"Attention to x_h of demonstration l\nfrom the query predicting x_h ({n} ctx)")
    if copy.shape[1]:
        im = ax.imshow(copy, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        ax.grid(False)
        ax.set_yticks(x, labels, fontsize=7)
        ax.set(xlabel="demonstration l")
        fig.colorbar(im, ax=ax, label="mass")
    else:  # one sequence per context (the peers' tasks)
        ax.text(0.5, 0.5, "no demonstrations (L = 0):\nnothing to copy", ha="center", va="center")
        ax.axis("off")
    out["inspect_copy"] = fig

    fig, axes = plt.subplots(1, 2, figsize=(max(8, 0.4 * len(labels) + 4), 3.2))
    axes[0].bar(x, [h["ablation_dnll"] for h in r["heads"]], color="C4")
    axes[0].set(ylabel="NLL change (nats)", title="mean-ablating the head's output")
    axes[1].bar(
        x, [np.nan if h["patching_restored"] is None else h["patching_restored"] for h in r["heads"]], color="C5"
    )
    axes[1].axhline(0, color="k", lw=0.8)
    axes[1].set(ylabel="restored (corrupted 0, clean 1)", title="patching clean output into corrupted run")
    for ax in axes:
        ax.set_xticks(x, labels, rotation=90, fontsize=7)
    fig.suptitle(
        f"Interventions per head, {r['intervention_contexts']} contexts "
        f"(clean NLL {r['nll_clean']:.4f}, corrupted {r['nll_corrupted']:.4f})",
        fontsize=9,
    )
    out["inspect_interventions"] = fig
    out["inspect_roles"] = _roles_figure(r, n)
    return out


CATEGORY_NAMES = {
    "prefix": "earlier,\nsame seq.",
    "self": "own\nposition",
    "same_position": "same pos.,\nother seqs",
    "other_position": "other pos.,\nother seqs",
    "later": "later,\nsame seq.",
    "special": "BOS /\nseparator",
    "candidates": "candidate\nparents",
    "parent": "true\nparent",
}
EMPTY_MASS = 0.005  # a category (or a query group) below this for every head is left out of the roles figure


def _roles_figure(r: dict, n: int):
    """Role profile per head (one heatmap per query group that the model has, values printed) beside its
    causal weight; categories no head attends to are left out and named in the title."""
    import textwrap

    import matplotlib.pyplot as plt
    import numpy as np

    heads = r["heads"]
    carriers = set(r["carriers"])
    m = np.array([[[h["role_profile"][c][g] for c in CATEGORIES] for g in range(len(GROUPS))] for h in heads], float)
    groups = [g for g in range(len(GROUPS)) if np.isfinite(m[:, g]).any()]  # [head, group, category]
    shown = [i for i, c in enumerate(CATEGORIES) if np.nanmax(np.nan_to_num(m[:, groups, i], nan=0.0)) >= EMPTY_MASS]
    left_out = [CATEGORIES[i] for i in range(len(CATEGORIES)) if i not in shown]
    ylabels = [
        "\n".join(textwrap.wrap(f"{h['label']}: {h['role'].split(' [')[0]}", 42, max_lines=3, placeholder=" …"))
        for h in heads
    ]
    widths = [len(shown)] * len(groups) + [3.5]
    fig, axes = plt.subplots(
        1, len(widths), figsize=(0.85 * sum(widths) + 4.5, 0.55 * len(heads) + 2.8),
        gridspec_kw={"width_ratios": widths}, sharey=True, layout="constrained",
    )  # fmt: skip
    for ax, g in zip(axes, groups):
        block = m[:, g][:, shown]
        im = ax.imshow(np.ma.masked_invalid(block), cmap="viridis", vmin=0, vmax=1, aspect="auto")
        ax.grid(False)
        for i in range(block.shape[0]):
            for j in range(block.shape[1]):
                if np.isfinite(block[i, j]):
                    ax.text(j, i, f"{block[i, j]:.2f}", ha="center", va="center", fontsize=8,
                            color="k" if block[i, j] > 0.6 else "w")  # fmt: skip
        ax.set_xticks(range(len(shown)), [CATEGORY_NAMES.get(CATEGORIES[i], CATEGORIES[i]) for i in shown], fontsize=9)
        ax.tick_params(axis="x", labelrotation=0)
        first_overlapping = next((j for j, i in enumerate(shown) if CATEGORIES[i] in OVERLAPPING), None)
        if first_overlapping:
            ax.axvline(first_overlapping - 0.5, color="w", lw=3)
        ax.set_title(f"attention mass from {GROUPS[g]} queries", fontsize=11)
    axes[0].set_yticks(range(len(heads)), ylabels, fontsize=9)
    for t, h in zip(axes[0].get_yticklabels(), heads):
        if h["label"] in carriers:
            t.set_fontweight("bold")
    fig.colorbar(im, ax=axes[len(groups) - 1], shrink=0.6, label="mass")
    ax = axes[-1]
    y = np.arange(len(heads))
    dnll = [h["ablation_dnll"] for h in heads]
    ax.barh(y, dnll, color=["C3" if h["label"] in carriers else "C7" for h in heads])
    for yi, v, h in zip(y, dnll, heads):
        patched = "-" if h["patching_restored"] is None else f"{h['patching_restored']:.2f}"
        ax.text(max(v, 0), yi, f" +{v:.3f} | {patched}", va="center", fontsize=8,
                fontweight="bold" if h["label"] in carriers else "normal")  # fmt: skip
    ax.set_xlim(0, max(dnll) * 1.6 if max(dnll) > 0 else 1)
    ax.set_xlabel("mean-ablation NLL change (nats)")
    ax.set_title("causal weight: ablation (nats) | patching\nshare restored; red: carries the computation", fontsize=11)
    if r["on_plateau"] is None:
        title = "no verdict (BMA ~ plateau)"
    elif r["on_plateau"]:
        title = f"{plateau_words(r)}: no head credited"
    else:
        circuit = "the paper's circuit" if r["paper_circuit"] else "the paper's circuit absent"
        title = f"progress {r['progress']:.2f}, {circuit}; carrying it: {', '.join(r['carriers'])}"
    note = f"\n(no head attends to: {', '.join(left_out)})" if left_out else ""
    fig.suptitle(f"{r['kind']} model, {n} contexts: {title}{note}", fontsize=12)
    return fig


def compute(subject, args) -> dict:
    r = inspect_subject(subject, args.n_contexts, args.seed)
    r["circuit_link"] = circuit_link(getattr(args, "checkpoint", None), subject.hash)
    return r


REQUIRES = frozenset({common.BAYES_TASK})  # what it needs of its subject
ANALYSIS = common.Analysis.from_module(globals())


main = ANALYSIS.main

if __name__ == "__main__":
    common.run(main)
