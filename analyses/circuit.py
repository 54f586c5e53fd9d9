"""Circuit discovery: which nodes and edges of the model's graph carry the task? Scores every edge under
each corruption, chooses the nodes and the edges, and answers two questions on held-out contexts.

    python -m analyses.circuit --checkpoint standard                 # the shipped standard GPT-2
    python -m analyses.circuit --checkpoint default --method eap-ig  # attribution patching
    python -m analyses.circuit --checkpoint theorem1:beta=50 --corruption mean

The graph, the scores and the runs are ``models.interp.circuit`` (its docstring says where the peer tools run).
Nodes: embeddings, heads, MLPs, the output; an edge enters one input of a receiver (a head's q, k or v; an
MLP; the output) at one group of positions (demonstrations, target, other). Scores (``--method``): exact
edge patching (each edge ablated alone, the rest clean) or EAP / EAP-IG. Ablated values (``--corruption``,
comma-separated; default ``demonstrations,mean``): the sender's value on contexts whose demonstrations come
from another tree (``demonstrations``, the task's own corruption: it keeps the target, so it cannot see what
reads only the target's own prefix), whose target tokens are re-drawn (``target``), on fresh contexts
(``resample``), or its mean over held-out contexts (``mean``, which sees both sides). Direction
(``--direction``): noising or denoising. Every score is a mean over the contexts with its standard error.
Metric: target NLL. Progress = (plateau NLL - NLL) / (plateau NLL - BMA NLL), the plateau being
uniform-parent BMA.

The circuit (default search): its NODES are every head or MLP whose mean ablation alone costs more than
3 standard errors, then the costliest others until the nodes alone, every other head and MLP mean-ablated,
keep ``--target`` of the progress, then, for each corruption under which the edges among them keep less,
the nodes its edge scores weigh most. Its EDGES, for each corruption, are the smallest top-n among the
edges between those nodes (edges whose |score| exceeds ``--min-z`` standard errors first) keeping
``--target``; the circuit's edges are their union. ``--n-edges`` / ``--threshold`` / ``--search greedy`` /
``--nodes`` choose otherwise. The two answers, on ``--n-held-out`` fresh contexts the search never saw
(default: the fewest of 512, 1024, ... giving the progress a standard error <= ``--target-se``), and again
on as many other fresh contexts:
- faithfulness under each corruption: the share of the progress its edges keep with every other edge at
  its ablated value; under ``demonstrations`` it says the circuit CARRIES THE DEMONSTRATIONS' EVIDENCE;
- sufficiency: the share its nodes alone keep with every other head and MLP mean-ablated (or resampled from
  fresh contexts of the task): the circuit COMPUTES THE PREDICTION.
A circuit found by denoising is also judged by its denoising faithfulness, the share of the clean-minus-
corrupted NLL it recovers when the corrupted run has only its edges restored. The faithfulness curve keeps
the top-n edges of the whole graph for n along the way, on the search contexts.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from analyses import common
from models.interp.baselines import per_context_baselines
from models.interp.circuit import (
    CORRUPTIONS,
    DIRECTIONS,
    NODE_ABLATIONS,
    EdgeScores,
    Runner,
    build_graph,
    curve_sizes,
    denoising_runner,
    eap_ig_scores,
    eap_scores,
    exact_scores,
    greedy,
    mean_se,
    node_ablated_values,
    node_costs,
    node_outputs,
    per_context_nll,
    ratio_se,
    source_writes,
    threshold,
)
from models.interp.interventions import description
from models.interp.subject import Subject

NAME = "circuit"
N_CONTEXTS = 128  # default --n-contexts (each exact edge score is one forward pass on all of them)
PAPER_ARGS = ["--checkpoint", "standard"]  # the committed figures/circuit*: the shipped GPT-2's circuit
QUICK_ARGS = ["--n-held-out", "16"]  # tests/analyses/test_every_family.py: the held-out sample at a quick size
FIGURES = {
    "circuit_graph.png": "the discovered circuit: nodes by layer, each kept edge coloured by the input it enters (q, k, v, MLP, output), drawn by position group, width by |score|.",
    "circuit_curve.png": "faithfulness (share of the full model's progress over the uniform-parent plateau kept) against the number of edges kept, top-n by |score|, with standard errors (denoising: also the share of the clean-minus-corrupted NLL recovered with only those edges restored).",
}
METHODS = ("exact", "eap", "eap-ig")
SEARCHES = ("top-n", "threshold", "greedy")


def values_of(runner: Runner, method: str, ig_steps: int) -> EdgeScores:
    """Each edge's score on each context, ``[edge, context]``, by ``method`` (``METHODS``)."""
    if method == "exact":
        return exact_scores(runner, progress=lambda e: tqdm(e, desc="exact edge patching", leave=False, disable=None))
    if method == "eap":
        return eap_scores(runner)
    return eap_ig_scores(runner, steps=ig_steps)


MAX_CURVE_POINTS = 1000  # circuit sizes on the curve; each is one ablated run over every context
MAX_IG_STEPS = 1024  # EAP-IG converges by 8 on the standard GPT-2 (README: Circuit discovery)


def among_nodes(graph, spec: str) -> list:
    """Every edge between the named heads / MLPs (``L1H2,MLP0``), the embeddings and the output."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    known = graph.node_order
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"--nodes: no node {', '.join(bad)} in this model's graph; nodes: {', '.join(known)}")
    return among(graph, names)


def among(graph, nodes) -> list:
    """Every edge between ``nodes`` (heads and MLPs), the embeddings and the output."""
    keep = set(nodes) | {"embed", "pos_embed", "output"}
    return [e for e in graph.edges if e.sender in keep and e.receiver in keep]


def faithfulness(runner: Runner, kept, plateau, full) -> dict:
    """Share of the full model's progress the circuit ``kept`` keeps, with its standard error."""
    values = runner.keep_only_values(kept)
    share, se = ratio_se(plateau - values, plateau - full)
    return {"n_edges": len(kept), "faithfulness": share, "se": se, "nll": values.mean().item()}


def restored(denoiser: Runner, kept, clean) -> dict:
    """Denoising faithfulness: the share of the clean-minus-corrupted NLL that the corrupted run recovers
    with only the edges ``kept`` restored to their clean values, with its standard error."""
    values = denoiser.run_values(kept)
    share, se = ratio_se(denoiser.clean_values - values, denoiser.clean_values - clean)
    return {"n_edges": len(kept), "faithfulness": share, "se": se, "nll": values.mean().item()}


def input_sums(values: EdgeScores) -> list[dict]:
    """Per layer's heads (``L1``) or other receiver (``MLP0``, ``output``), input and position group: the
    summed score of every edge into it, with its standard error over the contexts (a sum of single-edge
    effects, not the effect of ablating them together)."""
    rows: dict = {}
    for e, v in values.items():
        node = e.receiver[: e.receiver.index("H")] if e.receiver.startswith("L") else e.receiver
        rows.setdefault((node, e.input, e.group), []).append(v)
    out = []
    for (node, inp, group), vs in rows.items():
        total, se = mean_se(torch.stack(vs).sum(0))
        out.append({"receivers": node, "input": inp, "group": group, "n_edges": len(vs), "sum": total, "se": se})
    return out


def area(curve: list[dict], n_total: int) -> float:
    """Area under a faithfulness curve over the fraction of edges kept (trapezoids)."""
    xs = [c["n_edges"] / n_total for c in curve]
    return sum((xs[i + 1] - xs[i]) * (curve[i + 1]["faithfulness"] + curve[i]["faithfulness"]) / 2
               for i in range(len(curve) - 1))  # fmt: skip


def kl_to_full(runner: Runner, kept, full_lp) -> tuple[float, float]:
    """KL(full model || circuit) of the predictions of x_1..x_{H-1}, mean and SE over contexts."""
    lp = runner.run_log_probs([e for e in runner.graph.edges if e not in set(kept)]).double()
    kl = (full_lp.exp() * (full_lp - lp)).sum(-1)[:, 1:].mean(-1)
    return mean_se(kl)


# What each answer means, in the words the summary, the figure and the JSON use.
MEANS = {
    "demonstrations": "carries the demonstrations' evidence",
    "target": "carries the target's own prefix",
    "mean": "keeps the progress with every other edge mean-ablated",
    "resample": "keeps the progress with every other edge resampled from fresh contexts",
}
COMPUTES = "computes the prediction"  # node-level sufficiency: every other head and MLP ablated
DEFAULT_CORRUPTIONS = "demonstrations,mean"  # the task's corruption, and mean ablation (which sees the target side)
N_MEAN = 2048  # held-out contexts whose mean is each sender's / node's mean-ablated value
MIN_HELD_OUT, MAX_HELD_OUT = 512, 8192  # the held-out sample: doubled from the first until --target-se is reached
COST_Z = 3.0  # a node whose mean ablation alone costs more than this many standard errors is in the circuit
SEEDS = {"held_out": 1_000_003, "replicate": 2_000_006, "reference": 3_000_009}  # offsets from --seed


def corruptions_of(spec: str) -> list[str]:
    """``demonstrations,mean`` -> the corruptions, in order; ValueError naming a bad one."""
    names = [c.strip() for c in spec.split(",") if c.strip()]
    bad = [c for c in names if c not in CORRUPTIONS]
    if bad or not names or len(set(names)) != len(names):
        raise ValueError(f"--corruption: expected distinct names among {', '.join(CORRUPTIONS)}, comma-separated; "
                         f"got {spec!r}")  # fmt: skip
    return names


def ranked(stats: dict, min_z: float) -> list:
    """The edges of ``stats`` (``{edge: (score, se)}``), those whose |score| exceeds ``min_z`` standard errors
    first, each part by |score| descending."""
    return sorted(stats, key=lambda e: (not abs(stats[e][0]) > min_z * stats[e][1], -abs(stats[e][0])))


def held_out_contexts(subject, args) -> tuple[torch.Tensor, int]:
    """Fresh contexts for the held-out figures: ``--n-held-out``, or the smallest of 512, 1024, ... (at most
    8192) on which the model's progress has a standard error at most ``--target-se``."""
    task = subject.task
    n = args.n_held_out or MIN_HELD_OUT
    while True:
        tokens, _ = common.sample_contexts(task, n, args.seed + SEEDS["held_out"])
        plateau, bma = per_context_baselines(task, tokens)
        full = torch.cat([per_context_nll(subject.log_probs(tokens[i : i + 512]), tokens[i : i + 512])
                          for i in range(0, n, 512)])  # fmt: skip
        if args.n_held_out or ratio_se(plateau - full, plateau - bma)[1] <= args.target_se or n >= MAX_HELD_OUT:
            return tokens, n
        n *= 2


def measure(subject, graph, tokens, edges, nodes, corruptions, seed: int) -> dict:
    """On ``tokens``: the model's progress, the circuit ``edges``' faithfulness under each corruption (every
    other edge ablated), and the sufficiency of ``nodes`` (every other head and MLP mean- or resample-
    ablated), each with its standard error over the contexts."""
    task = subject.task
    plateau, bma = per_context_baselines(task, tokens)
    out = {"n_contexts": len(tokens)}
    full = None
    for c in corruptions:
        runner = Runner(subject, graph, tokens, source_writes(subject, graph, tokens, c, seed))
        full = runner.clean_values
        share, se = ratio_se(plateau - runner.keep_only_values(edges), plateau - full)
        out[f"faithfulness_{c}"], out[f"faithfulness_{c}_se"] = share, se
    out["progress"], out["progress_se"] = ratio_se(plateau - full, plateau - bma)
    out["nll"] = full.mean().item()
    reference = {"mean": common.sample_contexts(task, N_MEAN, seed + SEEDS["reference"])[0],
                 "resample": common.sample_contexts(task, len(tokens), seed + SEEDS["reference"] + 1)[0]}
    for ablation, ref in reference.items():
        values = node_ablated_values(subject, graph, tokens, nodes, ablation, ref)
        out[f"sufficiency_{ablation}"], out[f"sufficiency_{ablation}_se"] = ratio_se(plateau - values, plateau - full)
    return out


def search(runner, scores: dict, order, args, plateau, full) -> list:
    """The circuit chosen from one corruption's scores (``{edge: score}``, the edges it may keep;
    ``--search``; default: the smallest prefix of ``order`` that keeps ``--target`` of the progress, by
    bisection)."""
    if args.search == "greedy":
        return greedy(runner, args.threshold if args.threshold is not None else 1e-3)
    if args.search == "threshold":
        return threshold(scores, args.threshold if args.threshold is not None else 1e-3)
    if args.n_edges is not None:
        return order[: args.n_edges]
    lo, hi = 0, len(order)
    while lo < hi:
        mid = (lo + hi) // 2
        if faithfulness(runner, order[:mid], plateau, full)["faithfulness"] >= args.target:
            hi = mid
        else:
            lo = mid + 1
    return order[:lo]


def node_roles(graph, kept_by: dict, nodes: list[str], added: dict, at: dict) -> dict:
    """Per node of the circuit: which corruptions' circuits need it, at which positions it reads and writes
    (the groups of its kept edges), why it was added if no edge search needed it, and (``at``: per group of
    positions, its mean ablation there alone, mean and SE) where its output matters: its side is the groups
    where that costs more than ``COST_Z`` standard errors."""
    roles = {}
    for n in nodes:
        costly = {g for g, (c, se) in at.get(n, {}).items() if c > COST_Z * se}
        reads = {c: sorted({f"{e.input}@{e.group}" for e in kept if e.receiver == n}) for c, kept in kept_by.items()}
        writes = {c: sorted({f"{e.receiver}.{e.input}@{e.group}" for e in kept if e.sender == n})
                  for c, kept in kept_by.items()}  # fmt: skip
        needed = [c for c in kept_by if reads[c] or writes[c]]
        groups = costly or {g.split("@")[1] for c in needed for g in reads[c] + writes[c]}
        side = ("target side" if groups == {"target"} else "demonstration side" if groups == {"demonstrations"}
                else "both sides" if {"target", "demonstrations"} <= groups else ", ".join(sorted(groups)) or "none")
        roles[n] = {"needed_by": needed, "reads": reads, "writes": writes, "side": side,
                    "ablated_at": {g: {"cost": c, "se": se} for g, (c, se) in at.get(n, {}).items()},
                    **({"added": added[n]} if n in added else {})}  # fmt: skip
    return roles


@torch.no_grad()
def discover(subject: Subject, args) -> dict:
    task = subject.task
    graph = build_graph(subject)
    named = among_nodes(graph, args.nodes) if args.nodes else None  # bad names refused before any work
    corruptions = corruptions_of(args.corruption)
    tokens, _ = common.sample_contexts(task, args.n_contexts, args.seed)
    plateau, bma = per_context_baselines(task, tokens)
    edges = graph.edges
    sizes = curve_sizes(len(edges), args.curve_points)
    scored = {}  # corruption -> (runner, scorer, values, {edge: (score, se)}, order)
    for c in corruptions:
        runner = Runner(subject, graph, tokens, source_writes(subject, graph, tokens, c, args.seed))
        full = runner.clean_values
        scorer = denoising_runner(subject, graph, tokens, c, args.seed) if args.direction == "denoising" else runner
        values = values_of(scorer, args.method, args.ig_steps)
        stats = values.with_se()
        scored[c] = (runner, scorer, values, stats, ranked(stats, args.min_z))
    # The nodes: every head or MLP whose mean ablation alone costs > COST_Z standard errors, then the costliest
    # others until the nodes alone (the rest mean-ablated) keep --target of the progress, then, for each
    # corruption whose edges among them do not keep --target, the nodes its edges' scores weigh most.
    reference = common.sample_contexts(task, N_MEAN, args.seed + SEEDS["reference"])[0]
    costs = {n: mean_se(v) for n, v in node_costs(subject, graph, tokens, reference).items()}
    added: dict = {}
    if named is not None:
        nodes = graph.nodes(named)
    else:
        for n, (cost, cost_se) in costs.items():
            if cost > COST_Z * cost_se:
                added[n] = f"its mean ablation alone costs {cost:+.4f} +- {cost_se:.4f} nats (> {COST_Z:g} SE)"

        def sufficient(ns) -> float:
            values = node_ablated_values(subject, graph, tokens, ns, "mean", reference)
            return ratio_se(plateau - values, plateau - full)[0]

        for n in sorted(costs, key=lambda n: -costs[n][0]):
            if n in added:
                continue
            share = sufficient(list(added))
            if share >= args.target:
                break
            added[n] = f"the nodes before it alone kept {share:.3f} < {args.target:g} of the progress, rest mean-ablated"
        for c in corruptions:
            runner, _, _, stats, _ = scored[c]
            weight = {n: sum(abs(x) for e, (x, _) in stats.items() if n in (e.sender, e.receiver)) for n in costs}
            for n in sorted(costs, key=lambda n: -weight[n]):
                if n in added:
                    continue
                share = faithfulness(runner, among(graph, added), plateau, full)["faithfulness"]
                if share >= args.target:
                    break
                added[n] = f"the edges among the nodes before it kept {share:.3f} < {args.target:g} under {c}"
        nodes = [n for n in graph.node_order if n in added]
    within = set(named) if named is not None else set(among(graph, nodes))
    blocks, kept_by, passes, runs = {}, {}, 0, 0
    for c in corruptions:
        runner, scorer, values, stats, order = scored[c]
        curve = [faithfulness(runner, order[:n], plateau, full) for n in
                 tqdm(sizes, desc=f"faithfulness curve ({c})", leave=False, disable=None)]  # fmt: skip
        inner = [e for e in order if e in within]  # the search keeps edges among the nodes only
        scores = {e: stats[e][0] for e in inner}
        kept = named if named is not None else search(runner, scores, inner, args, plateau, full)
        found = faithfulness(runner, kept, plateau, full)
        row = lambda e: {**e.to_dict(), "score": stats[e][0], "se": stats[e][1]}  # noqa: E731
        block = {
            "corruption": CORRUPTIONS[c], "means": MEANS[c],
            "edges": [row(e) for e in sorted(kept, key=lambda e: -abs(stats[e][0]))],
            "n_within_2se": sum(abs(stats[e][0]) <= 2 * stats[e][1] for e in kept),
            "n_beyond_min_z": sum(abs(s) > args.min_z * se for s, se in stats.values()),
            "faithfulness": found["faithfulness"], "faithfulness_se": found["se"],
            "curve": curve, "curve_area": area(curve, len(edges)),
            "all_edges": [row(e) for e in edges],
            "by_input": input_sums(values),
        }  # fmt: skip
        if scorer is not runner:
            back = [restored(scorer, order[:n], full) for n in
                    tqdm(sizes, desc="denoising faithfulness curve", leave=False, disable=None)]  # fmt: skip
            d = restored(scorer, kept, full)
            block.update(denoising_curve=back, denoising_curve_area=area(back, len(edges)),
                         denoising_faithfulness=d["faithfulness"], denoising_faithfulness_se=d["se"])  # fmt: skip
            passes, runs = passes + scorer.passes, runs + scorer.context_runs
        if c == corruptions[0]:
            kl, kl_se = kl_to_full(runner, kept, subject.log_probs(tokens).double())
            block.update(kl_to_full=kl, kl_to_full_se=kl_se)
        passes, runs = passes + runner.passes, runs + runner.context_runs
        blocks[c], kept_by[c] = block, kept
    union = [e for e in edges if any(e in set(k) for k in kept_by.values())]
    groups = graph.groups[graph.receivers[0].site] if graph.family == "standard" else {}
    at: dict = {n: {} for n in nodes}
    for g, positions in groups.items():  # where each node's output matters: ablated at one group's positions
        for n, v in node_costs(subject, graph, tokens, reference, nodes=nodes, positions=positions).items():
            at[n][g] = mean_se(v)
    held, n_held = held_out_contexts(subject, args)
    held_out = measure(subject, graph, held, union, nodes, corruptions, args.seed + SEEDS["held_out"])
    fresh = common.sample_contexts(task, n_held, args.seed + SEEDS["replicate"])[0]
    replicate = measure(subject, graph, fresh, union, nodes, corruptions, args.seed + SEEDS["replicate"])
    first = blocks[corruptions[0]]
    score_of = {}
    for c in reversed(corruptions):  # each edge's score under the first corruption whose circuit kept it
        score_of.update({(e["sender"], e["receiver"], e["input"], e["group"]): (e["score"], e["se"], c)
                         for e in blocks[c]["edges"]})  # fmt: skip
    kept_edges = []
    for e in union:
        score, se, c = score_of[(e.sender, e.receiver, e.input, e.group)]
        kept_edges.append({**e.to_dict(), "score": score, "se": se, "scored_by": c,
                           "found_by": [k for k in corruptions if e in set(kept_by[k])]})  # fmt: skip
    kept_edges.sort(key=lambda e: -abs(e["score"]))
    sites = sorted({(graph.receiver(e.receiver, e.input).site, graph.receiver(e.receiver, e.input).capture)
                    for e in edges})  # fmt: skip
    interventions = [description(site, "add", f"ablated senders' change: {CORRUPTIONS[c]}")
                     for c in corruptions for site, _ in sites]  # fmt: skip
    interventions += [description(c, "patch", "the receiver's activation recomputed from its edited input")
                      for c in sorted({c for _, c in sites if c})]  # fmt: skip
    interventions += [description(hook, kind, f"every head / MLP outside the circuit: {NODE_ABLATIONS[a]}")
                      for a, kind in (("mean", "mean"), ("resample", "patch"))
                      for hook in sorted({h for h, _ in node_outputs(subject, graph).values()})]  # fmt: skip
    progress, progress_se = ratio_se(plateau - full, plateau - bma)
    return {
        "nodes": nodes, "node_roles": node_roles(graph, kept_by, nodes, added, at),
        "node_costs": {n: {"cost": c, "se": s} for n, (c, s) in costs.items()},
        "edges": kept_edges, "n_edges_total": len(edges),
        "corruptions": corruptions, "searches": blocks,
        "all_edges": first["all_edges"], "by_input": first["by_input"],
        "method": args.method, "direction": args.direction,
        "ablation": "mean" if corruptions == ["mean"] else "patch from a run on other contexts",
        "corruption": " + ".join(CORRUPTIONS[c] for c in corruptions),
        "metric": "target NLL (nats, x_1..x_{H-1})",
        "search": args.search, "target": args.target, "min_z": args.min_z, "target_se": args.target_se,
        "checkpoint_hash": subject.hash,
        "nll": full.mean().item(), "nll_bma": bma.mean().item(), "nll_plateau": plateau.mean().item(),
        "progress": progress, "progress_se": progress_se,
        "faithfulness": held_out[f"faithfulness_{corruptions[0]}"],
        "faithfulness_se": held_out[f"faithfulness_{corruptions[0]}_se"],
        "faithfulness_means": MEANS[corruptions[0]],
        "sufficiency": held_out["sufficiency_mean"], "sufficiency_se": held_out["sufficiency_mean_se"],
        "sufficiency_means": f"{COMPUTES}: its nodes alone, every other head and MLP mean-ablated "
                             f"({NODE_ABLATIONS['mean']})",
        "held_out": held_out, "replicate": replicate,
        "kl_to_full": first["kl_to_full"], "kl_to_full_se": first["kl_to_full_se"],
        "curve": first["curve"], "curve_area": first["curve_area"],
        **{k: first[k] for k in ("denoising_curve", "denoising_curve_area", "denoising_faithfulness",
                                 "denoising_faithfulness_se") if k in first},
        "n_contexts": len(tokens), "n_held_out": n_held, "n_mean_reference": N_MEAN,
        "forward_passes": passes, "context_runs": runs,
        "interventions": interventions,
    }  # fmt: skip


def compute(subject: Subject, args) -> dict:
    return discover(subject, args)


def _curve_words(curve: list[dict]) -> str:
    return ", ".join(f"{c['n_edges']}: {c['faithfulness']:.2f}+-{c['se']:.2f}" for c in curve)


def answers(r: dict, where: str = "held_out") -> list[str]:
    """The circuit's answers on one sample (``held_out`` or ``replicate``), in words."""
    m = r[where]
    lines = [f"  {MEANS[c]}: its edges alone keep {m[f'faithfulness_{c}']:.3f} +- {m[f'faithfulness_{c}_se']:.3f} "
             f"of the progress (faithfulness; every other edge: {CORRUPTIONS[c]})" for c in r["corruptions"]]  # fmt: skip
    lines += [f"  {COMPUTES}: its nodes alone keep {m[f'sufficiency_{a}']:.3f} +- {m[f'sufficiency_{a}_se']:.3f} "
              f"(sufficiency; every other head and MLP: {NODE_ABLATIONS[a]})" for a in NODE_ABLATIONS]  # fmt: skip
    return lines


def summary(r: dict) -> str:
    denoised = "denoising_faithfulness" in r
    h, rep = r["held_out"], r["replicate"]
    lines = [
        f"{NAME}: {r['method']} scores ({r.get('direction', 'noising')}) under {', '.join(r['corruptions'])}; search on "
        f"{r['n_contexts']} contexts, answers on {r['n_held_out']} held-out contexts (chosen for progress SE <= "
        f"{r['target_se']}; means over {r['n_mean_reference']} more)",
        f"model NLL {r['nll']:.4f}, BMA {r['nll_bma']:.4f}, plateau {r['nll_plateau']:.4f}: progress "
        f"{r['progress']:.3f} +- {r['progress_se']:.3f} (search contexts), {h['progress']:.3f} +- "
        f"{h['progress_se']:.3f} (held out; analyses.inspect samples its own contexts from the same seed, so the two "
        "agree within their standard errors, not to the digit)",
        f"circuit: {len(r['edges'])} of {r['n_edges_total']} edges ({len(r['edges']) / r['n_edges_total']:.2f}), "
        f"nodes {', '.join(r['nodes']) or 'none'}; on {h['n_contexts']} held-out contexts:",
        *answers(r),
        f"re-measured on {rep['n_contexts']} fresh contexts: " + "; ".join(
            f"{k.replace('_', ' ')} {rep[k]:.3f} +- {rep[k + '_se']:.3f}" for k in rep
            if k.endswith(tuple(r["corruptions"]) + tuple(NODE_ABLATIONS)) and not k.endswith("_se")),
    ]
    for c in r["corruptions"]:
        b = r["searches"][c]
        lines.append(
            f"search under {c} ({b['corruption']}): {len(b['edges'])} edges keep {b['faithfulness']:.3f} +- "
            f"{b['faithfulness_se']:.3f} on the search contexts; {b['n_within_2se']} of them within 2 SE of zero "
            f"({b['n_beyond_min_z']} edges of the graph beyond {r['min_z']:g} SE); needs nodes "
            + (", ".join(n for n, x in r["node_roles"].items() if c in x["needed_by"]) or "none")
        )
        if c == r["corruptions"][0]:
            lines.append(f"  KL(full || circuit) {b['kl_to_full']:.4f} +- {b['kl_to_full_se']:.4f}; faithfulness "
                         f"curve area {b['curve_area']:.3f}: " + _curve_words(b["curve"]))  # fmt: skip
    lines.append("node roles (which corruptions need it; where it reads and writes; why added):")
    for n, x in r["node_roles"].items():
        cost = r["node_costs"].get(n, {})
        where = ", ".join(f"{g} {c['cost']:+.4f} +- {c['se']:.4f}" for g, c in x.get("ablated_at", {}).items())
        lines.append(f"  {n}: {x['side']}, needed by {', '.join(x['needed_by']) or 'no edge search'}; mean ablation "
                     f"alone {cost.get('cost', float('nan')):+.4f} +- {cost.get('se', float('nan')):.4f} nats"
                     + (f" (at the positions of {where})" if where else "")
                     + (f"; added: {x['added']}" if "added" in x else ""))  # fmt: skip
    left = [f"{n} ({c['cost']:+.4f} +- {c['se']:.4f})" for n, c in r["node_costs"].items() if n not in r["nodes"]]
    lines.append("outside the circuit (mean ablation alone): " + (", ".join(left) or "none"))
    if denoised:
        lines.append(f"restored alone in the corrupted run, it recovers {r['denoising_faithfulness']:.3f} +- "
                     f"{r['denoising_faithfulness_se']:.3f} of the clean-minus-corrupted NLL; denoising curve area "
                     f"{r['denoising_curve_area']:.3f}: " + _curve_words(r["denoising_curve"]))  # fmt: skip
    lines += [
        f"summed over each input under {r['corruptions'][0]}, where beyond two standard errors (receivers.input @ "
        "positions: n edges, the sum of their scores): "
        + "; ".join(f"{x['receivers']}.{x['input']} @ {x['group']}: {x['n_edges']}, {x['sum']:+.4f} +- {x['se']:.4f}"
                    for x in r.get("by_input", []) if abs(x["sum"]) > 2 * x["se"]),
        "strongest edges (sender -> receiver.input @ positions: score, the metric's change when it alone is "
        + ("restored to its clean value in the corrupted run" if r.get("direction") == "denoising" else "ablated")
        + ("" if r["method"] == "exact" else ", to first order (attribution)")
        + ", under the corruption named, mean over the search contexts with its standard error):",
    ]
    for e in r["edges"][:15]:
        err = "" if e.get("se") is None else f" +- {e['se']:.4f}"
        lines.append(f"  {e['sender']:>9s} -> {e['receiver']}.{e['input']} @ {e['group']}: {e['score']:+.4f}{err}"
                     f" ({e.get('scored_by', r['corruptions'][0])})")  # fmt: skip
    return "\n".join(lines)


COLOURS = {"q": "C0", "k": "C2", "v": "C1", "in": "C7", "out": "k"}
INPUT_WORDS = {"q": "a head's query", "k": "a head's key", "v": "a head's value", "in": "an MLP", "out": "the logits"}
STYLES = {"demonstrations": "-", "target": "--", "other": ":"}
GROUP_WORDS = {"demonstrations": "the demonstrations'", "target": "the target's", "other": "other"}
ARRIVAL = {"q": -0.13, "k": 0.0, "v": 0.13}  # where on a head's box (about 0.35 wide) its q, k, v edges arrive
BEND = {"q": 0.12, "k": 0.0, "v": -0.12, "in": 0.06, "out": 0.06}  # arc3 curvature per input: q, k, v apart


def _row(node: str) -> float:
    if node in ("embed", "pos_embed"):
        return 0
    if node == "output":
        return 99
    if node.startswith("MLP"):
        return 2 * int(node[3:]) + 2
    return 2 * int(node[1 : node.index("H")]) + 1


def short_name(name: str | None) -> str:
    """A model's name for a title: a path by its last part (a user's checkpoint path would fill the line)."""
    name = str(name or "model").rstrip("/")
    return name.rsplit("/", 1)[-1] or name


def figures(r: dict, args) -> dict:
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    nodes = ["embed", "pos_embed", *r["nodes"], "output"]
    nodes = [n for n in nodes if n in r["nodes"] or any(n in (e["sender"], e["receiver"]) for e in r["edges"])]
    rows = sorted({_row(n) for n in nodes})
    widest = max((sum(_row(n) == row for n in nodes) for row in rows), default=1)
    pos = {}
    for y, row in enumerate(rows):
        members = [n for n in nodes if _row(n) == row]
        for i, n in enumerate(members):
            pos[n] = (i - (len(members) - 1) / 2, y)
    fig, ax = plt.subplots(figsize=(max(7.5, 1.05 * widest + 1), 1.25 * len(rows) + 2.2), layout="constrained")
    top = max((abs(e["score"]) for e in r["edges"]), default=1) or 1
    width = lambda score: 0.5 + 3.5 * abs(score) / top  # noqa: E731  (line width of an edge, points)
    span = max(widest - 1, 1)
    for e in r["edges"]:
        (x0, y0), (x1, y1) = pos[e["sender"]], pos[e["receiver"]]
        # A head's q, k and v arrive at three points of its box; an MLP's or the output's many inputs
        # spread over its box by where they come from, so that arrowheads do not pile up in one place.
        x1 += ARRIVAL.get(e["input"], 0.3 * (x0 - x1) / span)
        ax.annotate("", (x1, y1 - 0.14), (x0, y0 + 0.14), arrowprops=dict(
            arrowstyle="-|>", mutation_scale=8, color=COLOURS[e["input"]], lw=width(e["score"]),
            ls=STYLES[e["group"]], alpha=0.75, shrinkA=0, shrinkB=0,
            connectionstyle=f"arc3,rad={BEND[e['input']]}"))  # fmt: skip
    for n, (x, y) in pos.items():
        ax.text(x, y, n, ha="center", va="center", fontsize=9, zorder=3,
                bbox=dict(boxstyle="round", fc="w", ec="0.3"))  # fmt: skip
    xs = [p[0] for p in pos.values()] or [0]
    if not r["edges"]:
        ax.text(0, 0, "no edge kept", ha="center", va="center")
    ax.set(xlim=(min(xs) - 0.6, max(xs) + 0.6), ylim=(-0.4, max(len(rows), 1) - 0.6))
    ax.axis("off")
    used = {e["input"] for e in r["edges"]} or set(COLOURS)
    handles = [Line2D([], [], color=c, label=f"into {INPUT_WORDS[k]}") for k, c in COLOURS.items() if k in used]
    groups = {e["group"] for e in r["edges"]} or set(STYLES)
    handles += [
        Line2D([], [], color="0.3", ls=s, label=f"from {GROUP_WORDS[g]} positions") for g, s in STYLES.items() if g in groups
    ]
    handles += [
        Line2D([], [], color="0.3", lw=width(v), label=f"|score| {v:.2g} (width: the edge's effect)") for v in (top, top / 4)
    ]
    if r["edges"]:  # with none, nothing to explain
        fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncol=3, frameon=False)
    h = r["held_out"]
    ax.set_title(
        f"{short_name(args.subject_name)}: {len(r['edges'])} of {r['n_edges_total']} edges ({r['method']}, "
        f"{', '.join(r['corruptions'])}); on {h['n_contexts']} held-out contexts\n{r['faithfulness_means']}: "
        f"{r['faithfulness']:.3f} \u00b1 {r['faithfulness_se']:.3f} of the progress (faithfulness)\n{COMPUTES}: "
        f"{h['sufficiency_mean']:.3f} \u00b1 {h['sufficiency_mean_se']:.3f} (nodes alone, rest mean-ablated)",
        fontsize=9)  # fmt: skip
    fig2, ax2 = plt.subplots(figsize=(5.5, 3.5))
    n = [c["n_edges"] for c in r["curve"]]
    f = [c["faithfulness"] for c in r["curve"]]
    se = [c["se"] for c in r["curve"]]
    ax2.errorbar(n, f, yerr=se, marker="o", ms=3, capsize=2, label="noising: the circuit alone keeps")
    if "denoising_curve" in r:
        back = r["denoising_curve"]
        ax2.errorbar([c["n_edges"] for c in back], [c["faithfulness"] for c in back], yerr=[c["se"] for c in back],
                     marker="s", ms=3, capsize=2, label="denoising: restored alone, it recovers")  # fmt: skip
    ax2.axhline(1, color="k", ls=":", lw=0.8)
    ax2.axvline(len(r["edges"]), color="C3", ls="--", lw=0.8, label=f"circuit ({len(r['edges'])} edges)")
    ax2.set_xscale("symlog", linthresh=1)
    ax2.set_xlim(-0.5, 1.3 * max(n))  # symlog's margins would otherwise reach negative edge counts
    denoised = "denoising_curve" in r
    ax2.set(xlabel="edges kept (top-n by |score|)",
            ylabel="share kept / recovered" if denoised else "share of the model's progress kept")  # fmt: skip
    areas = f"area {r['curve_area']:.3f}" + (f" / {r['denoising_curve_area']:.3f}" if denoised else "")
    ax2.set_title(f"faithfulness curve, {areas} ({r['method']}, {r['n_contexts']} contexts)", fontsize=9)
    ax2.legend(fontsize=7)
    fig2.tight_layout()
    return {"circuit_graph": fig, "circuit_curve": fig2}


def add_flags(parser) -> None:
    parser.add_argument("--method", choices=METHODS, default="exact", help="how each edge is scored: exact path patching, or attribution patching (EAP, EAP-IG) (default: exact)")
    parser.add_argument("--corruption", default=DEFAULT_CORRUPTIONS, help="the senders' ablated values, comma-separated: the circuit is the union of the circuits each finds (" + "; ".join(f"{k}: {v}" for k, v in CORRUPTIONS.items()) + f") (default: {DEFAULT_CORRUPTIONS})")
    parser.add_argument("--min-z", type=float, default=2.0, help="edges whose |score| exceeds this many standard errors come first in the top-n order (default: 2)")
    parser.add_argument("--n-held-out", type=int, default=None, help=f"fresh contexts for the held-out answers (default: the smallest of {MIN_HELD_OUT}, {2 * MIN_HELD_OUT}, ... up to {MAX_HELD_OUT} giving progress SE <= --target-se)")
    parser.add_argument("--target-se", type=float, default=0.01, help="the standard error of the model's progress that the held-out sample must reach (default: 0.01)")
    parser.add_argument("--direction", choices=DIRECTIONS, default="noising", help="noising: an edge's receiver sees the ablated value in the clean run; denoising: it sees the clean value in the corrupted run (a circuit found by denoising is judged by noising and by denoising) (default: noising)")
    parser.add_argument("--search", choices=SEARCHES, default="top-n", help="how the circuit is chosen from the scores: top-n edges, a score threshold, or greedy ACDC-style pruning (default: top-n)")
    parser.add_argument("--n-edges", type=int, default=None, help="top-n: keep this many edges (default: the fewest that keep --target)")
    parser.add_argument("--target", type=float, default=0.9, help="top-n without --n-edges: the share of the model's progress the circuit must keep (default: 0.9)")
    parser.add_argument("--threshold", type=float, default=None, help="threshold / greedy: keep edges whose |score| exceeds this (default: 1e-3)")
    parser.add_argument("--nodes", default=None, help="score a given circuit instead of searching: every edge among these comma-separated nodes (L1H2,MLP0,...)")
    parser.add_argument("--curve-points", type=int, default=8, help="number of non-empty circuit sizes on the faithfulness curve, which also plots the empty circuit (0 edges), at most 1000 (default: 8)")
    parser.add_argument("--ig-steps", type=int, default=8, help="EAP-IG: interpolation steps between the clean and corrupted runs, at most 1024 (default: 8)")


def check_flags(parser, args) -> None:
    common.check_at_least(parser, args, n_contexts=2, curve_points=1, ig_steps=1)
    common.check_at_most(parser, args, curve_points=MAX_CURVE_POINTS, ig_steps=MAX_IG_STEPS)
    try:
        corruptions = corruptions_of(args.corruption)
    except ValueError as e:
        parser.error(str(e))
    if args.direction == "denoising" and "mean" in corruptions:
        parser.error("--direction denoising needs a corruption that is a run on other contexts, not --corruption mean")
    if args.n_held_out is not None and args.n_held_out < 2:
        parser.error(f"--n-held-out must be >= 2, got {args.n_held_out}")
    if not args.target_se > 0:
        parser.error(f"--target-se must be > 0, got {args.target_se}")
    if args.n_edges is not None and args.n_edges < 0:
        parser.error(f"--n-edges must be >= 0, got {args.n_edges}")
    if not 0 < args.target <= 1:  # finite: every float flag is (models.cli.finite_float)
        parser.error(f"--target must be a share of the model's progress in (0, 1], got {args.target}")
    if args.threshold is not None and args.threshold < 0:
        parser.error(f"--threshold must be >= 0 (it bounds |score|), got {args.threshold}")


def record(r: dict) -> dict:
    return r


REQUIRES = frozenset({common.MARKOV_TASK})  # what it needs of its subject
ANALYSIS = common.register(globals())
