"""Circuit discovery: which edges of the model's graph carry the task? Scores every edge, keeps the
strongest, and measures how much of the model's progress the circuit alone keeps.

    python -m analyses.circuit --checkpoint standard                 # the shipped standard GPT-2
    python -m analyses.circuit --checkpoint default --method eap-ig  # attribution patching
    python -m analyses.circuit --checkpoint theorem1:beta=50 --corruption mean

The graph, the scores and the run of a circuit are ``models.interp.circuit`` (its docstring says why no circuit
library runs on our subjects). Nodes: embeddings, heads, MLPs, the output; an edge enters one input of a
receiver (a head's q, k or v; an MLP; the output) at one group of positions (demonstrations, target, other).
Scores (``--method``): exact edge patching (each edge ablated alone, the rest clean) or EAP / EAP-IG
(gradient times the sender's change). Ablated value (``--corruption``): the sender's value on contexts whose
demonstrations come from another tree (``demonstrations``, the task's own corruption), whose target
tokens are re-drawn (``target``), on fresh contexts (``resample``), or its mean over held-out contexts
(``mean``). Direction (``--direction``): noising (the edge's receiver sees the ablated value in the clean
run) or denoising (it sees the clean value in the corrupted run). Every score is a mean over the contexts
of each context's score (for EAP and EAP-IG, each context's attribution), with its standard error. Metric:
target NLL. Progress of a run = (plateau NLL - its NLL) / (plateau NLL - BMA NLL), the plateau being
uniform-parent BMA; the faithfulness of a circuit = the share of the full model's progress it keeps with
every other edge ablated, ``(plateau - circuit) / (plateau - full)``, with its standard error over the
contexts. A circuit found by denoising is judged both ways: by that, and by its denoising faithfulness,
the share of the clean-minus-corrupted NLL it recovers when the corrupted run has only its edges restored,
``(corrupted - circuit) / (corrupted - clean)``. Search (``--search``): the top-n edges, a threshold on |score|, or ACDC-style
greedy pruning; the circuit reported is the smallest top-n set keeping ``--target`` of the progress
unless ``--n-edges`` / ``--threshold`` say otherwise. The faithfulness curve keeps the top-n edges for
n along the way (denoising: both curves), and its area is over the fraction of edges kept.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from analyses import common
from models.interp.circuit import (
    CORRUPTIONS,
    DIRECTIONS,
    Runner,
    build_graph,
    curve_sizes,
    denoising_runner,
    greedy,
    mean_se,
    per_context_nll,
    ratio_se,
    source_writes,
    threshold,
    top_n,
)
from models.interp.interventions import description
from models.interp.subject import Subject
from probes import bma_predictive

NAME = "circuit"
N_CONTEXTS = 128  # default --n-contexts (each exact edge score is one forward pass on all of them)
PAPER_ARGS = ["--checkpoint", "standard"]  # the committed figures/circuit*: the shipped GPT-2's circuit
FIGURES = {
    "circuit_graph.png": "the discovered circuit: nodes by layer, each kept edge coloured by the input it enters (q, k, v, MLP, output), drawn by position group, width by |score|.",
    "circuit_curve.png": "faithfulness (share of the full model's progress over the uniform-parent plateau kept) against the number of edges kept, top-n by |score|, with standard errors (denoising: also the share of the clean-minus-corrupted NLL recovered with only those edges restored).",
}
METHODS = ("exact", "eap", "eap-ig")
SEARCHES = ("top-n", "threshold", "greedy")


def values_of(runner: Runner, method: str, ig_steps: int) -> torch.Tensor:
    """Each edge's score on each context, ``[edge, context]``."""
    if method == "exact":
        return runner.exact_values(progress=lambda e: tqdm(e, desc="exact edge patching", leave=False))
    if method == "eap":
        return runner.eap_values()
    return runner.eap_ig_values(steps=ig_steps)


MAX_CURVE_POINTS = 1000  # circuit sizes on the curve; each is one ablated run over every context
MAX_IG_STEPS = 1024  # EAP-IG converges by 8 on the standard GPT-2 (README: Circuit discovery)


def among_nodes(graph, spec: str) -> list:
    """Every edge between the named heads / MLPs (``L1H2,MLP0``), the embeddings and the output."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    known = graph.node_order
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"--nodes: no node {', '.join(bad)} in this model's graph; nodes: {', '.join(known)}")
    keep = set(names) | {"embed", "pos_embed", "output"}
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


def input_sums(graph, values: torch.Tensor) -> list[dict]:
    """Per layer's heads (``L1``) or other receiver (``MLP0``, ``output``), input and position group: the
    summed score of every edge into it, with its standard error over the contexts (a sum of single-edge
    effects, not the effect of ablating them together)."""
    rows: dict = {}
    for e, v in zip(graph.edges, values):
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


@torch.no_grad()
def discover(subject: Subject, args) -> dict:
    task = subject.task
    L, H = task.n_examples, task.seq_len
    graph = build_graph(subject)
    named = among_nodes(graph, args.nodes) if args.nodes else None  # bad names refused before any work
    tokens, _ = common.sample_contexts(task, args.n_contexts, args.seed)
    runner = Runner(subject, graph, tokens, source_writes(subject, graph, tokens, args.corruption, args.seed))
    full = runner.clean_values
    full_lp = subject.log_probs(tokens).double()
    plateau = per_context_nll(bma_predictive(task.pi, tokens, L, H, task.root, demonstrations=[], log=True), tokens)
    bma = per_context_nll(bma_predictive(task.pi, tokens, L, H, task.root, log=True), tokens)
    progress, progress_se = ratio_se(plateau - full, plateau - bma)
    scorer = runner
    if args.direction == "denoising":
        scorer = denoising_runner(subject, graph, tokens, args.corruption, args.seed)
    values = values_of(scorer, args.method, args.ig_steps)
    scores, ses = zip(*(mean_se(v) for v in values)) if len(values) else ((), ())
    edges = graph.edges
    sizes = curve_sizes(len(edges), args.curve_points)
    curve = [faithfulness(runner, top_n(edges, scores, n), plateau, full) for n in
             tqdm(sizes, desc="faithfulness curve", leave=False)]  # fmt: skip
    denoising = {}
    if scorer is not runner:
        back = [restored(scorer, top_n(edges, scores, n), full) for n in
                tqdm(sizes, desc="denoising faithfulness curve", leave=False)]  # fmt: skip
        denoising = {"denoising_curve": back, "denoising_curve_area": area(back, len(edges))}
    if named is not None:
        kept = named
    elif args.search == "greedy":
        kept = greedy(runner, args.threshold if args.threshold is not None else 1e-3)
    elif args.search == "threshold":
        kept = threshold(edges, scores, args.threshold if args.threshold is not None else 1e-3)
    elif args.n_edges is not None:
        kept = top_n(edges, scores, args.n_edges)
    else:  # the smallest top-n keeping --target of the progress (bisection on the top-n order)
        lo, hi = 0, len(edges)
        while lo < hi:
            mid = (lo + hi) // 2
            if faithfulness(runner, top_n(edges, scores, mid), plateau, full)["faithfulness"] >= args.target:
                hi = mid
            else:
                lo = mid + 1
        kept = top_n(edges, scores, lo)
    found = faithfulness(runner, kept, plateau, full)
    if scorer is not runner:
        back = restored(scorer, kept, full)
        denoising.update(denoising_faithfulness=back["faithfulness"], denoising_faithfulness_se=back["se"])
    kl, kl_se = kl_to_full(runner, kept, full_lp)
    by_edge, se = dict(zip(edges, scores)), dict(zip(edges, ses))
    sites = sorted({(graph.receiver(e.receiver, e.input).site, graph.receiver(e.receiver, e.input).capture)
                    for e in edges})  # fmt: skip
    interventions = [
        description(site, "add", f"ablated senders' change: {CORRUPTIONS[args.corruption]}") for site, _ in sites
    ]
    interventions += [description(c, "patch", "the receiver's activation recomputed from its edited input")
                      for c in sorted({c for _, c in sites if c})]  # fmt: skip
    return {
        "nodes": graph.nodes(kept),
        "edges": [{**e.to_dict(), "score": by_edge[e], "se": se[e]} for e in sorted(kept, key=lambda e: -abs(by_edge[e]))],
        "n_edges_total": len(edges),
        "all_edges": [{**e.to_dict(), "score": by_edge[e], "se": se[e]} for e in edges],
        "by_input": input_sums(graph, values),
        "method": args.method,
        "direction": args.direction,
        "ablation": "mean" if args.corruption == "mean" else "patch from a run on other contexts",
        "corruption": CORRUPTIONS[args.corruption],
        "metric": "target NLL (nats, x_1..x_{H-1})",
        "search": args.search,
        "checkpoint_hash": subject.hash,
        "nll": full.mean().item(), "nll_bma": bma.mean().item(), "nll_plateau": plateau.mean().item(),
        "progress": progress, "progress_se": progress_se,
        "faithfulness": found["faithfulness"], "faithfulness_se": found["se"], "nll_circuit": found["nll"],
        "kl_to_full": kl, "kl_to_full_se": kl_se,
        "curve": curve, "curve_area": area(curve, len(edges)), **denoising,
        "n_contexts": len(tokens), "forward_passes": runner.passes + (scorer.passes if scorer is not runner else 0),
        "context_runs": runner.context_runs + (scorer.context_runs if scorer is not runner else 0),
        "interventions": interventions,
    }  # fmt: skip


def compute(subject: Subject, args) -> dict:
    return discover(subject, args)


def _curve_words(curve: list[dict]) -> str:
    return ", ".join(f"{c['n_edges']}: {c['faithfulness']:.2f}+-{c['se']:.2f}" for c in curve)


def summary(r: dict) -> str:
    denoised = "denoising_faithfulness" in r
    lines = [
        f"{NAME}: {r['method']} scores ({r.get('direction', 'noising')}), ablation by {r['corruption']}, "
        f"{r['n_contexts']} contexts",
        f"model NLL {r['nll']:.4f}, BMA {r['nll_bma']:.4f}, plateau {r['nll_plateau']:.4f}: progress "
        f"{r['progress']:.3f} +- {r['progress_se']:.3f}",
        f"circuit ({r['search']}): {len(r['edges'])} of {r['n_edges_total']} edges "
        f"({len(r['edges']) / r['n_edges_total']:.2f}) keep {r['faithfulness']:.3f} +- {r['faithfulness_se']:.3f} "
        f"of the progress; KL(full || circuit) {r['kl_to_full']:.4f} +- {r['kl_to_full_se']:.4f}",
        *([f"restored alone in the corrupted run, it recovers {r['denoising_faithfulness']:.3f} +- "
           f"{r['denoising_faithfulness_se']:.3f} of the clean-minus-corrupted NLL"] if denoised else []),
        "nodes: " + (", ".join(r["nodes"]) or "none"),
        f"faithfulness curve area {r['curve_area']:.3f}: " + _curve_words(r["curve"]),
        *([f"denoising faithfulness curve area {r['denoising_curve_area']:.3f}: " + _curve_words(r["denoising_curve"])]
          if denoised else []),  # fmt: skip
        "summed over each input, where beyond two standard errors (receivers.input @ positions: n edges, the "
        "sum of their scores): "
        + "; ".join(f"{x['receivers']}.{x['input']} @ {x['group']}: {x['n_edges']}, {x['sum']:+.4f} +- {x['se']:.4f}"
                    for x in r.get("by_input", []) if abs(x["sum"]) > 2 * x["se"]),
        "strongest edges (sender -> receiver.input @ positions: score, the metric's change when it alone is "
        + ("restored to its clean value in the corrupted run" if r.get("direction") == "denoising" else "ablated")
        + ("" if r["method"] == "exact" else ", to first order (attribution)")
        + ", mean over the contexts with its standard error):",
    ]
    for e in r["edges"][:15]:
        err = "" if e.get("se") is None else f" +- {e['se']:.4f}"
        lines.append(f"  {e['sender']:>9s} -> {e['receiver']}.{e['input']} @ {e['group']}: {e['score']:+.4f}{err}")
    return "\n".join(lines)


COLOURS = {"q": "C0", "k": "C2", "v": "C1", "in": "C7", "out": "k"}
STYLES = {"demonstrations": "-", "target": "--", "other": ":"}


def _row(node: str) -> float:
    if node in ("embed", "pos_embed"):
        return 0
    if node == "output":
        return 99
    if node.startswith("MLP"):
        return 2 * int(node[3:]) + 2
    return 2 * int(node[1 : node.index("H")]) + 1


def figures(r: dict, args) -> dict:
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    nodes = ["embed", "pos_embed", *r["nodes"], "output"]
    nodes = [n for n in nodes if n in r["nodes"] or any(n in (e["sender"], e["receiver"]) for e in r["edges"])]
    rows = sorted({_row(n) for n in nodes})
    pos = {}
    for y, row in enumerate(rows):
        members = [n for n in nodes if _row(n) == row]
        for i, n in enumerate(members):
            pos[n] = (i - (len(members) - 1) / 2, y)
    fig, ax = plt.subplots(figsize=(9, 1.4 * len(rows) + 1))
    top = max((abs(e["score"]) for e in r["edges"]), default=1) or 1
    for e in r["edges"]:
        (x0, y0), (x1, y1) = pos[e["sender"]], pos[e["receiver"]]
        ax.annotate("", (x1, y1 - 0.12), (x0, y0 + 0.12), arrowprops=dict(
            arrowstyle="-|>", color=COLOURS[e["input"]], lw=0.5 + 3.5 * abs(e["score"]) / top,
            ls=STYLES[e["group"]], alpha=0.8, shrinkA=0, shrinkB=0, connectionstyle="arc3,rad=0.08"))  # fmt: skip
    for n, (x, y) in pos.items():
        ax.text(x, y, n, ha="center", va="center", fontsize=9,
                bbox=dict(boxstyle="round", fc="w", ec="0.3"))  # fmt: skip
    xs = [p[0] for p in pos.values()] or [0]
    if not r["edges"]:
        ax.text(0, 0, "no edge kept", ha="center", va="center")
    ax.set(xlim=(min(xs) - 1, max(xs) + 1), ylim=(-0.6, max(len(rows), 1) - 0.4))
    ax.axis("off")
    handles = [Line2D([], [], color=c, label=f"into {k}") for k, c in COLOURS.items()]
    handles += [Line2D([], [], color="0.3", ls=s, label=f"at {g} positions") for g, s in STYLES.items()]
    ax.legend(handles=handles, fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
    ax.set_title(
        f"{args.subject_name}: {len(r['edges'])} of {r['n_edges_total']} edges keep {r['faithfulness']:.2f} "
        f"+- {r['faithfulness_se']:.2f} of the progress\n({r['method']}, {r['corruption']}, "
        f"{r['n_contexts']} contexts)", fontsize=9)  # fmt: skip
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
    parser.add_argument("--corruption", choices=list(CORRUPTIONS), default="demonstrations",
                        help="the senders' ablated values (default: demonstrations from another tree)")  # fmt: skip
    parser.add_argument("--direction", choices=DIRECTIONS, default="noising", help="noising: an edge's receiver sees the ablated value in the clean run; denoising: it sees the clean value in the corrupted run (a circuit found by denoising is judged by noising and by denoising) (default: noising)")
    parser.add_argument("--search", choices=SEARCHES, default="top-n", help="how the circuit is chosen from the scores: top-n edges, a score threshold, or greedy ACDC-style pruning (default: top-n)")
    parser.add_argument("--n-edges", type=int, default=None, help="top-n: keep this many edges (default: the fewest that keep --target)")
    parser.add_argument("--target", type=float, default=0.9, help="top-n without --n-edges: the share of the model's progress the circuit must keep (default: 0.9)")
    parser.add_argument("--threshold", type=float, default=None, help="threshold / greedy: keep edges whose |score| exceeds this (default: 1e-3)")
    parser.add_argument("--nodes", default=None, help="score a given circuit instead of searching: every edge among these comma-separated nodes (L1H2,MLP0,...)")
    parser.add_argument("--curve-points", type=int, default=8, help="number of circuit sizes on the faithfulness curve, at most 1000 (default: 8)")
    parser.add_argument("--ig-steps", type=int, default=8, help="EAP-IG: interpolation steps between the clean and corrupted runs, at most 1024 (default: 8)")


def check_flags(parser, args) -> None:
    common.check_at_least(parser, args, n_contexts=2, curve_points=1, ig_steps=1)
    common.check_at_most(parser, args, curve_points=MAX_CURVE_POINTS, ig_steps=MAX_IG_STEPS)
    if args.direction == "denoising" and args.corruption == "mean":
        parser.error("--direction denoising needs a corruption that is a run on other contexts, not --corruption mean")
    if args.n_edges is not None and args.n_edges < 0:
        parser.error(f"--n-edges must be >= 0, got {args.n_edges}")


def record(r: dict) -> dict:
    return r


REQUIRES = frozenset({common.MARKOV_TASK})  # what it needs of its subject
ANALYSIS = common.Analysis.from_module(globals())

main = ANALYSIS.main

if __name__ == "__main__":
    common.run(main)
