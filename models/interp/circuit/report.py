"""A circuit in words and figures: ``summary`` (the text ``python -m analyses.circuit`` prints) and ``figures`` (the
graph of its nodes and kept edges, and the faithfulness curve) of a circuit's record, ``CircuitResult.to_dict()``
(the JSON's ``results``), so that a result redraws from its JSON alone. ``CircuitResult.summary()`` and
``CircuitResult.figures()`` call them."""

from __future__ import annotations

import textwrap

from models.interp.circuit.config import MIN_HELD_OUT
from models.interp.circuit.corruptions import CORRUPTIONS
from models.interp.circuit.graph import INPUTS, Node
from models.interp.circuit.nodes import NODE_ABLATIONS
from models.interp.circuit.scores import beyond_2se
from models.plumbing.words import positions_words

COMPUTES = "computes the prediction"  # node-level sufficiency: every other head and MLP ablated


def _work_words(work: dict) -> str:
    """The work counted from the weights, per stage (before it ran, except where said), beside the seconds each
    stage took."""
    counted, seconds = work["counted_tflop"], work.get("seconds", {})
    return (f"work counted from the weights before each stage ran: {sum(counted.values()):.2f} TFLOP ("
            + ", ".join(f"{k} {v:.2g}" for k, v in counted.items()) + ")"
            + ("; seconds each stage took: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()) if seconds else ""))


def _curve_words(curve: list[dict]) -> str:
    return ", ".join(f"{c['n_edges']}: {c['faithfulness']:.2f}+-{c['se']:.2f}" for c in curve)


def answers(r: dict, where: str = "held_out") -> list[str]:
    """The circuit's answers on one sample (``held_out`` or ``replicate``), in words: shares of the model's
    progress there, printed only if that progress is beyond 2 SE of zero."""
    m = r[where]
    if not beyond_2se(m["progress"], m["progress_se"]):
        return [f"  no share: the model's progress on these contexts is {m['progress']:.3f} +- {m['progress_se']:.3f}, "
                "not beyond 2 standard errors of zero"]  # fmt: skip
    lines = [f"  {CORRUPTIONS[c].means}: its edges alone keep {m[f'faithfulness_{c}']:.3f} +- "
             f"{m[f'faithfulness_{c}_se']:.3f} of the progress (faithfulness; every other edge: {CORRUPTIONS[c].words})"
             for c in r["corruptions"]]  # fmt: skip
    every = r.get("level") == "nodes" and not r.get("edges_pruned")  # every edge among the nodes: one run
    same = [c for c in r["corruptions"] if CORRUPTIONS[c].averaged] if every else []
    lines += [f"  {COMPUTES}: its nodes alone keep {m[f'sufficiency_{a}']:.3f} +- {m[f'sufficiency_{a}_se']:.3f} "
              f"(sufficiency; every other head and MLP: {NODE_ABLATIONS[a]}"
              + (f"; for a circuit of nodes, the same run as faithfulness under {same[0]})" if a == "mean" and same else ")")
              for a in NODE_ABLATIONS]  # fmt: skip
    return lines


def _held_out_words(r: dict) -> str:
    if r.get("n_held_out_fixed"):
        return f"answers on {r['n_held_out']} held-out contexts (fixed by --n-held-out"
    return f"answers on {r['n_held_out']} held-out contexts (sized for progress SE {r['target_se']} from the spread of the first {MIN_HELD_OUT}"


def summary(r: dict) -> str:
    over = positions_words(r.get("positions", "all"), r.get("trained_on", "all"))
    if r.get("refused"):
        return "\n".join([
            f"circuit: {r['method']} scores ({r['direction']}) under {', '.join(r['corruptions'])}; model NLL "
            f"{r['nll']:.4f}, BMA {r['nll_bma']:.4f}, plateau {r['nll_plateau']:.4f} on {r['n_contexts']} contexts "
            + over,
            f"no circuit: {r['refused']}",
        ])  # fmt: skip
    denoised = "denoising_faithfulness" in r
    h, rep = r["held_out"], r["replicate"]
    if rep is None:
        replicated = f"not re-measured on fresh contexts: {r.get('replicate_note')}"
    elif beyond_2se(rep["progress"], rep["progress_se"]):
        replicated = f"re-measured on {rep['n_contexts']} fresh contexts: " + "; ".join(
            f"{k.replace('_', ' ')} {rep[k]:.3f} +- {rep[k + '_se']:.3f}"
            for k in rep
            if k.endswith(tuple(r["corruptions"]) + tuple(NODE_ABLATIONS)) and not k.endswith("_se")
        )
    else:
        replicated = f"re-measured on {rep['n_contexts']} fresh contexts: " + answers(r, "replicate")[0].strip()
    nodes_level = r.get("level") == "nodes"
    scorer = r.get("scored_with", r["method"])
    lines = [
        f"circuit: {scorer} scores ({r.get('direction', 'noising')}) under {', '.join(r['corruptions'])}; search on "
        f"{r['n_contexts']} contexts, {_held_out_words(r)}; means over {r['n_mean_reference']} more); NLLs " + over,
        f"model NLL {r['nll']:.4f}, BMA {r['nll_bma']:.4f}, plateau {r['nll_plateau']:.4f}: progress "
        f"{r['progress']:.3f} +- {r['progress_se']:.3f} (search contexts), {h['progress']:.3f} +- "
        f"{h['progress_se']:.3f} (held out; analyses.inspect samples its own contexts from the same seed, so the two "
        "agree within their standard errors, not to the digit)",
        f"circuit: {len(r['edges'])} of {r['n_edges_total']} edges ({len(r['edges']) / r['n_edges_total']:.2f}"
        + (("; pruned among its nodes" if r.get("edges_pruned") else "; every edge among its nodes") if nodes_level else "")
        + f"), nodes {', '.join(r['nodes']) or 'none'}; on {h['n_contexts']} held-out contexts:",
        *answers(r),
        *([f"MISSED ITS TARGET: {'; '.join(r['missed_target'])} (more search contexts, --n-contexts, or a higher "
           "--target make a larger circuit)"] if r.get("missed_target") else []),
        replicated,
        *([f"scored with EAP-IG: {r['scoring_note']}"] if r.get("scoring_note") else []),
        *([f"a circuit of nodes: {r['level_note']}"] if nodes_level else []),
        *([_work_words(r["work"])] if r.get("work", {}).get("counted_tflop") else []),
    ]
    for c in r["corruptions"]:
        b = r["searches"][c]
        lines.append(
            f"search under {c} ({b['corruption']}): {len(b['edges'])} edges keep {b['faithfulness']:.3f} +- "
            f"{b['faithfulness_se']:.3f} on the search contexts; {b['n_within_2se']} of them within 2 SE of zero "
            f"({b['n_beyond_min_z']} edges of the {'circuit' if nodes_level else 'graph'} beyond {r['min_z']:g} SE); needs nodes "
            + (", ".join(n for n, x in r["node_roles"].items() if c in x["needed_by"]) or "none")
        )
        if c == r["corruptions"][0] and "kl_to_full" in b:
            lines.append(f"  KL(full || circuit) {b['kl_to_full']:.4f} +- {b['kl_to_full_se']:.4f}; faithfulness "
                         f"curve area {b['curve_area']:.3f}: " + _curve_words(b["curve"]))  # fmt: skip
    lines.append("node roles (which corruptions need it; where it reads and writes; why added):")
    for n, x in r["node_roles"].items():
        cost, exact = r["node_costs"].get(n) or r.get("node_attribution", {}).get(n, {}), n in r["node_costs"]
        where = ", ".join(f"{g} {c['cost']:+.4f} +- {c['se']:.4f}" for g, c in x.get("ablated_at", {}).items())
        lines.append(f"  {n}: {x['side']}, needed by {', '.join(x['needed_by']) or 'no edge search'}; mean ablation "
                     f"alone {cost.get('cost', float('nan')):+.4f} +- {cost.get('se', float('nan')):.4f} nats"
                     + ("" if exact else " to first order (attribution)")
                     + (f" (at the positions of {where})" if where else "")
                     + (f"; added: {x['added']}" if "added" in x else ""))  # fmt: skip
    left = [f"{n} ({c['cost']:+.4f} +- {c['se']:.4f})" for n, c in r["node_costs"].items() if n not in r["nodes"]]
    estimated = [n for n in r.get("node_attribution", {}) if n not in r["node_costs"] and n not in r["nodes"]]
    lines.append("outside the circuit (mean ablation alone): " + (", ".join(left) or "none")
                 + (f"; {len(estimated)} more estimated to first order only (the JSON's node_attribution)" if estimated else ""))  # fmt: skip
    if denoised and beyond_2se(r.get("denoising_cost", 1.0), r.get("denoising_cost_se", 0.0)):
        lines.append(f"restored alone in the corrupted run, it recovers {r['denoising_faithfulness']:.3f} +- "
                     f"{r['denoising_faithfulness_se']:.3f} of the clean-minus-corrupted NLL; denoising curve area "
                     f"{r['denoising_curve_area']:.3f}: " + _curve_words(r["denoising_curve"]))  # fmt: skip
    elif denoised:
        lines.append(f"no denoising share: the corruption costs {r['denoising_cost']:+.4f} +- "
                     f"{r['denoising_cost_se']:.4f} nats, not beyond 2 standard errors of zero")  # fmt: skip
    lines += [
        f"summed over each input under {r['corruptions'][0]}, where beyond two standard errors (receivers.input @ "
        "positions: n edges, the sum of their scores): "
        + "; ".join(
            f"{x['receivers']}.{x['input']} @ {x['group']}: {x['n_edges']}, {x['sum']:+.4f} +- {x['se']:.4f}"
            for x in r.get("by_input", [])
            if abs(x["sum"]) > 2 * x["se"]
        ),
        "strongest edges (sender -> receiver.input @ positions: score, the metric's change when it alone is "
        + ("restored to its clean value in the corrupted run" if r.get("direction") == "denoising" else "ablated")
        + ("" if scorer == "exact" else ", to first order (attribution)")
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
ARRIVAL = {"q": -0.13, "k": 0.0, "v": 0.13}  # where under a head's label its q, k, v edges arrive (marked there)
BEND = {"q": 0.12, "k": 0.0, "v": -0.12, "in": 0.06, "out": 0.06}  # each input's first curvature: q, k, v apart
PAD = 0.05  # data units (about 0.05 inch) between a label and its box


def _row(node: Node) -> int:
    """The drawing's row of a node: embeddings at the bottom, each layer's heads, then its MLP, the output on top."""
    if node.kind in ("embed", "pos_embed"):
        return 0
    return 99 if node.kind == "output" else 2 * node.layer + (2 if node.kind == "mlp" else 1)


def _bezier(p0, c, p1, n: int = 48):
    """Points along the quadratic Bezier from ``p0`` through control ``c`` to ``p1``, ``[n, 2]``."""
    import numpy as np

    t = np.linspace(0, 1, n)[:, None]
    return (1 - t) ** 2 * np.asarray(p0) + 2 * (1 - t) * t * np.asarray(c) + t**2 * np.asarray(p1)


def _route(p0, p1, bend: float, boxes: list) -> tuple:
    """The control point of an edge from ``p0`` to ``p1``: the first curvature, from ``bend`` outwards, whose
    curve crosses none of ``boxes`` (``(x0, y0, x1, y1)``, the other nodes'); else the one crossing least."""
    (x0, y0), (x1, y1) = p0, p1
    best = None
    for rad in [bend] + [bend + s * 0.1 * k for k in range(1, 10) for s in (1, -1)]:
        c = ((x0 + x1) / 2 + rad * (y1 - y0), (y0 + y1) / 2 - rad * (x1 - x0))
        pts = _bezier(p0, c, p1)
        hits = sum(int(((pts[:, 0] > a) & (pts[:, 0] < b) & (pts[:, 1] > lo) & (pts[:, 1] < hi)).sum())
                   for a, lo, b, hi in boxes)  # fmt: skip
        if hits == 0:
            return c
        best = min(best or (hits, c), (hits, c), key=lambda h: h[0])
    return best[1]


def _draw_nodes(fig, ax, pos: dict, inputs: dict) -> dict:
    """Each node's label in a box; under a head's label, the letters of its inputs that edges enter (q, k, v,
    in their colours, where those edges arrive). Returns each node's box ``(x0, y0, x1, y1)`` in data units
    (measured: the figure is drawn once, its layout complete)."""
    from matplotlib.patches import FancyBboxPatch

    texts = {}
    for n, (x, y) in pos.items():
        lettered = n.kind == "head" and inputs.get(n)
        label = ax.text(x, y + (0.06 if lettered else 0), str(n), ha="center", va="center", fontsize=9, zorder=4)
        marks = [ax.text(x + ARRIVAL[i], y - 0.09, i, ha="center", va="center", fontsize=7, color=COLOURS[i],
                         fontweight="bold", zorder=4) for i in INPUTS if i in inputs.get(n, ())] if lettered else []  # fmt: skip
        texts[n] = [label, *marks]
    fig.canvas.draw()
    to_data = ax.transData.inverted()
    boxes = {}
    for n, ts in texts.items():
        (x0, y0), (x1, y1) = to_data.transform([[min(t.get_window_extent().x0 for t in ts), min(t.get_window_extent().y0 for t in ts)],
                                                [max(t.get_window_extent().x1 for t in ts), max(t.get_window_extent().y1 for t in ts)]])  # fmt: skip
        x, _ = pos[n]
        half = max(x1 - x, x - x0, 0.2) + PAD  # q, k and v marks fit under even a short label
        boxes[n] = (x - half, y0 - PAD, x + half, y1 + PAD)
        ax.add_patch(FancyBboxPatch((x - half, y0 - PAD), 2 * half, y1 - y0 + 2 * PAD, boxstyle="round,pad=0,rounding_size=0.05",
                                    fc="w", ec="0.3", lw=0.8, zorder=3))  # fmt: skip
    return boxes


def _message_figure(title: str, text: str):
    """A figure that says why there is nothing to draw."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 2.5), layout="constrained")
    ax.axis("off")
    ax.set_title(title, fontsize=9)
    ax.text(0.5, 0.5, "\n".join(textwrap.wrap(text, 80)), ha="center", va="center", fontsize=9, transform=ax.transAxes)
    return fig


def figures(r: dict, title: str) -> dict:
    """``{"circuit_graph": figure, "circuit_curve": figure}`` of a circuit's record (``CircuitResult.to_dict()``,
    the JSON's ``results``); ``title``: the model's name as a title shows it."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch
    from matplotlib.path import Path as CurvePath

    if r.get("refused"):
        title = f"{title}: no circuit ({r['method']}, {', '.join(r['corruptions'])})"
        return {"circuit_graph": _message_figure(title, r["refused"]),
                "circuit_curve": _message_figure(f"faithfulness curve: {title}", r["refused"])}  # fmt: skip
    nodes_level, scorer = r.get("level") == "nodes", r.get("scored_with", r["method"])
    edges = [{**e, "sender": Node.parse(e["sender"]), "receiver": Node.parse(e["receiver"])} for e in r["edges"]
             if not nodes_level or abs(e["score"]) > 2 * e["se"]]  # a circuit of nodes: its edges beyond 2 SE
    kept = [Node.parse(n) for n in r["nodes"]]
    ends = [Node("embed"), Node("pos_embed"), *kept, Node("output")]
    nodes = [n for n in ends if n in kept or any(n in (e["sender"], e["receiver"]) for e in edges)]
    rows = sorted({_row(n) for n in nodes})
    widest = max((sum(_row(n) == row for n in nodes) for row in rows), default=1)
    pos = {}
    for y, row in enumerate(rows):
        members = [n for n in nodes if _row(n) == row]
        for i, n in enumerate(members):
            pos[n] = (i - (len(members) - 1) / 2, y)
    fig, ax = plt.subplots(figsize=(max(7.5, 1.05 * widest + 1), 1.25 * len(rows) + 2.2), layout="constrained")
    xs = [p[0] for p in pos.values()] or [0]
    ax.set(xlim=(min(xs) - 0.6, max(xs) + 0.6), ylim=(-0.4, max(len(rows), 1) - 0.6))
    ax.axis("off")
    top = max((abs(e["score"]) for e in edges), default=1) or 1
    width = lambda score: 0.5 + 3.5 * abs(score) / top  # noqa: E731  (line width of an edge, points)
    used = {e["input"] for e in edges} or set(COLOURS)
    handles = [Line2D([], [], color=c, label=f"into {INPUT_WORDS[k]}" + (f" (at its {k})" if k in INPUTS else ""))
               for k, c in COLOURS.items() if k in used]  # fmt: skip
    groups = {e["group"] for e in edges} or set(STYLES)
    handles += [
        Line2D([], [], color="0.3", ls=s, label=f"from {GROUP_WORDS[g]} positions")
        for g, s in STYLES.items()
        if g in groups
    ]
    handles += [
        Line2D([], [], color="0.3", lw=width(v), label=f"|score| {v:.2g} (width: the edge's effect)")
        for v in (top, top / 4)
    ]
    if edges:  # with none, nothing to explain
        fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncol=3, frameon=False)
    else:
        ax.text(0, -0.3, "no edge kept", ha="center", va="center")
    h = r["held_out"]
    ax.set_title(
        f"{title}: "
        + (f"{len(r['nodes'])} nodes, {len(r['edges'])} edges among them ({len(edges)} drawn: |{scorer} score| > 2 SE; "
           if nodes_level else f"{len(edges)} of {r['n_edges_total']} edges ({scorer}, ")
        + f"{', '.join(r['corruptions'])}); on {h['n_contexts']} held-out contexts\n{r['faithfulness_means']}: "
        f"{r['faithfulness']:.3f} \u00b1 {r['faithfulness_se']:.3f} of the progress (faithfulness)\n{COMPUTES}: "
        f"{h['sufficiency_mean']:.3f} \u00b1 {h['sufficiency_mean_se']:.3f} (nodes alone, rest mean-ablated)",
        fontsize=9)  # fmt: skip
    inputs: dict = {}
    for e in edges:
        inputs.setdefault(e["receiver"], set()).add(e["input"])
    boxes = _draw_nodes(fig, ax, pos, inputs)
    span = max(widest - 1, 1)
    for e in edges:
        s, t = e["sender"], e["receiver"]
        (x0, _), (x1, _) = pos[s], pos[t]
        # A head's q, k and v arrive under their letters; an MLP's or the output's many inputs spread over its
        # box by where they come from, so that arrowheads do not pile up in one place.
        x1 += ARRIVAL.get(e["input"], 0.3 * (x0 - x1) / span)
        p0, p1 = (x0, boxes[s][3]), (x1, boxes[t][1])
        c = _route(p0, p1, BEND[e["input"]], [b for n, b in boxes.items() if n not in (s, t)])
        path = CurvePath([p0, c, p1], [CurvePath.MOVETO, CurvePath.CURVE3, CurvePath.CURVE3])
        ax.add_patch(FancyArrowPatch(path=path, arrowstyle="-|>", mutation_scale=8, color=COLOURS[e["input"]],
                                     lw=width(e["score"]), ls=STYLES[e["group"]], alpha=0.75, zorder=2))  # fmt: skip
    if not r["curve"]:
        return {"circuit_graph": fig, "circuit_curve": _message_figure(
            f"{title}: no faithfulness curve",
            "a circuit of nodes (every edge among them) has no curve of top-n edges: " + r["level_note"])}  # fmt: skip
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
