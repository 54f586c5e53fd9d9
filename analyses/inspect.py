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
the candidates, BMA with no demonstration: the plateau at initialisation). Verdict rules (each sentence the
report prints, with the numbers that guard it: ``models.interp.inspection.SENTENCES``; a share is printed only
when its denominator is beyond 2 SE of zero):
- ``progress = (NLL_uniform - NLL) / (NLL_uniform - NLL_BMA)``, with its standard error over the contexts.
  The model is WORSE THAN THE PLATEAU if the progress is below 0 by more than 2 SE (the report then says what
  to check first: the layout in task.json and the token offset), ON THE PLATEAU if it is below 0.1 by more
  than 2 SE, and shows NO PROGRESS BEYOND ITS STANDARD ERROR if it is within 2 SE of zero otherwise; then no
  head is credited. If BMA is within 0.005 nats or 2 SE of the plateau on the sampled contexts, no verdict is
  possible (``on_plateau`` None).
- Otherwise a head is PARENT-SELECTING if its candidate mass >= 0.5, its parent accuracy closes at
  least half the gap from the uniform baseline to BMA, and its TV to BMA is below the uniform's.
- A head is a COPYER of demonstration l if its attention to position h of demonstration l, averaged
  over h, is >= 0.5.
- The PAPER'S CIRCUIT is recognised when there are copyers and a parent-selecting head, and its heads alone
  (every other head mean-ablated) keep at least 0.8 of the progress (or they are every head of the model).
- Off the plateau, the heads that CARRY the computation are those whose mean ablation costs at least
  a tenth of the model's gain over the plateau, or whose patching restores at least a tenth of the
  clean-vs-corrupted difference, either beyond 2 SE (if none does, the three largest by ablation, reported
  as distributed), and every head whose ablation costs more than 3 SE.
  Each is named with its role: parent selector, copyer of demonstration l, a positional role (a SINK on the
  context's first key, a SEQUENCE-START head, a SELF head, a FIXED-OFFSET head: ``probes.roles.position_role``),
  or the category holding its attention (``probes.roles.ROLE_NAMES``: within-sequence (prefix) head, cross-
  demonstration same-position reader, ...); else NO ROLE. Every role needs at least half the head's attention
  and twice its CHANCE, the mass uniform causal attention puts on the same keys from the same queries
  (``over_chance``); both are printed beside it (docs/explanation/roles.md).
- Heads named by what they read in the sequence (``sequence_heads``; ``probes.roles.sequence_scores``):
  previous-token heads and induction heads (in-context Markov chains), heads on the parent of the query's
  own token (a fixed graph), each against its chance as above.
- THROUGH WHICH INPUT each head of the last layer acts (``input_costs``): the metric's change when every
  edge into its query, key or value input (every sender, every position: per-input path patching of
  ``models.interp.circuit``) carries the corrupted run's value, and each input's share of their sum, with
  standard errors. A carrier whose value input takes at least 0.8 of it, its attention nearly content-free,
  is named for the mechanism: EVIDENCE POOLED THROUGH THE VALUES AT FIXED POSITIONS; one whose query and
  key inputs take at least half SELECTS THROUGH ITS KEYS/QUERIES (the paper's parent selector does).
- The paper's circuit's and the carriers' SUFFICIENCY (every other head mean-ablated) only when some head is
  ablated and the model's gain over the plateau is beyond 2 SE; else one line says why not.
The report links to the discovered circuit (``python -m analyses.circuit``), whose edges are the
mechanism, when that file exists; ``inspect``'s head names are its summary.
"""

from __future__ import annotations

from analyses import common

NAME = "inspect"
REQUIRES = frozenset({common.BAYES_TASK})  # what it needs of its subject


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    n_contexts: int = common.n_contexts(512, "contexts of the attention statistics and the progress (at least 2: "
                                        "each number has a standard error)", minimum=2)  # fmt: skip
    positions: str = common.positions_option("NLL, progress, ablation and patching")


common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import json
from pathlib import Path

from models.interp.inspection import POOLING, inspect_subject  # the measurement; the thresholds: its THRESHOLDS
from probes.roles import CATEGORIES, GROUPS, OVERLAPPING

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


# The report: words, tables and figures made from inspect_subject's result, and nothing measured here ----


def through_words(label: str, inputs: dict) -> str:
    """``L1H0: v 0.99 +- 0.01, k 0.00 +- 0.00, q 0.00 +- 0.00 of its inputs' cost (0.153 +- 0.010 nats)``; no
    shares when that cost is not beyond 2 SE of zero (``SENTENCES["share"]``)."""
    h = inputs[label]
    if not h.get("cost") and h["v"]["share"] is None:
        return f"{label}: no cost (nothing the corruption changes reaches its inputs)"
    if h["v"]["share"] is None:
        return (f"{label}: its inputs' cost {h['cost']:.3f} +- {h['se']:.3f} nats, not beyond 2 SE of zero: no share "
                "of it to split between v, k and q")  # fmt: skip
    shares = ", ".join(f"{x} {h[x]['share']:.2f} +- {h[x]['share_se']:.2f}" for x in ("v", "k", "q"))
    return f"{label}: {shares} of its inputs' cost ({h['cost']:.3f} +- {h['se']:.3f} nats)"


def sequence_text(r: dict) -> list[str]:
    """One line per kind of sequence head, with each head's mass (and the induction chance level)."""
    by_label = {h["label"]: h["sequence"] for h in r["heads"]}
    order = sum(1 for k in r["sequence_heads"] if k.startswith("previous_"))
    induction = "induction heads" if order == 1 else f"generalized induction heads ({order} tokens matched)"
    words = {"previous_token": "previous-token heads", "induction": induction, "own_parent": "own-parent heads"}
    lines = []
    for kind, labels in r["sequence_heads"].items():
        found = ", ".join(
            f"{x} ({by_label[x][kind]:.2f}" + (f", chance {by_label[x][f'{kind}_chance']:.2f})"
                                               if f"{kind}_chance" in by_label[x] else ")")
            for x in labels
        )  # fmt: skip
        word = words.get(kind) or f"{kind.split('_')[1]}-back heads (the token {kind.split('_')[1]} before)"
        lines.append(f"{word}: {found or 'none'}")
    return lines


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _cost(h: dict) -> str:
    se = h.get("ablation_se")
    return f"{h['ablation_dnll']:+.4f}" + ("" if se is None else f" +- {se:.4f}") + " nats"


def _progress(r: dict) -> str:
    """``0.352 +- 0.021`` (a rounding error below zero printed as 0.000, not -0.000)."""
    return f"{round(r['progress'], 3) + 0.0:.3f} +- {r.get('progress_se', 0.0):.3f}"


def _patching(h: dict) -> str:
    se = h.get("patching_se")
    return _fmt(h["patching_restored"]) + ("" if se is None or h["patching_restored"] is None else f" +- {se:.2f}")


CHECK_FIRST = (
    "a model should not do worse than ignoring the demonstrations, so check first how it is read: the layout "
    "(task.json's `layout`: where BOS, separators and the task's tokens lie in its input ids; a task.json without "
    "one reads the task's own), and the token offset (task token s is input id s + token_offset); then the task "
    "itself (pi, L, H)"
)


def circuit_text(r: dict) -> str:
    """The verdict in words, with the measurements and thresholds behind it (``SENTENCES``): below or on the
    plateau, the paper's circuit, or the heads that carry the computation."""
    t = r["thresholds"]
    by_label = {h["label"]: h for h in r["heads"]}
    named = "; ".join(f"{c} ({_cost(by_label[c])})" for c in r.get("costly_heads", []))
    costly = f"; heads whose mean ablation costs > {t['cost_z']:g} SE: {named}" if named else ""
    if r["on_plateau"] is None:
        gap = r["nll_uniform"] - r["nll_bma"]
        return (
            f"BMA's NLL is below the uniform-parent plateau's by {gap:.4f} +- {r.get('gap_se', 0.0):.4f} nats on these "
            f"contexts: less than {t['min_plateau_gap']} or within 2 SE, so no progress is measured and no head can be "
            f"credited (use more contexts or demonstrations){costly}"
        )
    progress = f"progress {_progress(r)}"
    if r["worse_than_plateau"]:
        read = f"; read now with the layout {r['layout']}" if r.get("layout") else ""
        return (f"WORSE THAN THE UNIFORM-PARENT PLATEAU (its NLL is {r['nll'] - r['nll_uniform']:.4f} nats above the "
                f"uniform-parent mixture's; {progress}, below 0 by more than 2 SE): {CHECK_FIRST}{read}. No head is "
                f"credited{costly}")  # fmt: skip
    if r["on_plateau"]:
        where = (
            f"NO PROGRESS BEYOND ITS STANDARD ERROR ({progress}: within 2 SE of zero, and not below "
            f"{t['plateau_progress']:g} by 2 SE; more contexts would tell)"
            if r.get("regime") == "no_progress"
            else f"ON THE UNIFORM-PARENT PLATEAU ({progress}, below {t['plateau_progress']:g} by more than 2 SE)"
        )
        return (f"{where}: no head is credited with the demonstrations' evidence (best head {r['best_head']} is not "
                f"evidence of a mechanism); " + (f"heads whose mean ablation costs > {t['cost_z']:g} SE (they compute "
                f"the plateau's own prediction): {named}" if named else
                f"no head's mean ablation costs > {t['cost_z']:g} SE"))  # fmt: skip
    named = "; ".join(
        f"{c} ({r['roles'][c]}: ablation {_cost(by_label[c])}, patching {_patching(by_label[c])})" for c in r["carriers"]
    )
    carried = ("no single head carries it; the largest causal weights: " if r["carriers_distributed"] else "") + named
    stage = (f"LEAVING THE PLATEAU ({progress}, between {t['plateau_progress']:g} and "
             f"{t['off_plateau_progress']:g})" if r.get("regime") == "leaving" else f"off the plateau ({progress})")  # fmt: skip
    copy = ", ".join(f"{k}->demo {v}" for k, v in r["copyers"].items())
    suff = r.get("sufficiency", {}).get("paper_circuit")
    if suff is None:
        kept = ""
    elif suff.get("share") is not None:
        kept = f"its heads alone keep {suff['share']:.3f} +- {suff['se']:.3f} of the progress"
    elif not suff.get("ablated", True):
        kept = "its heads are every head of the model (no other head to ablate, so sufficiency is not a test)"
    else:
        kept = f"no sufficiency is measured ({suff['refused']})"
    selection = f"parent selection by {', '.join(r['parent_selecting'])}"
    if r["paper_circuit"]:
        bar = f" (>= {t['sufficient']:g})" if suff and suff.get("share") is not None else ""
        return f"{stage}. THE PAPER'S CIRCUIT: copyers {copy}, then {selection}; {kept}{bar}. Carrying the computation: {carried}"
    if r.get("paper_circuit_attention"):
        below = f", below {t['sufficient']:g}" if suff and suff.get("share") is not None else ""
        return (
            f"{stage}. The attention looks like the paper's circuit (copyers {copy}; {selection}), but {kept}{below}: "
            f"not the paper's circuit. Carrying the computation: {carried}"
        )
    missing = [
        w
        for w, present in (("no parent-selecting head", r["parent_selecting"]), ("no copyer", r["copyers"]))
        if not present
    ]
    return f"{stage}, and the paper's circuit is absent ({', '.join(missing)}). Carrying the computation: {carried}"


REGIME_WORDS = {  # for figure titles
    "worse": "worse than the uniform-parent plateau (check the layout)",
    "plateau": "on the uniform-parent plateau",
    "no_progress": "no progress beyond its SE",
}


def plateau_words(r: dict) -> str:
    """Where a model below the bar stands, for figure titles."""
    if r["worse_than_plateau"]:
        return REGIME_WORDS["worse"]
    return REGIME_WORDS.get(r.get("regime"), REGIME_WORDS["plateau"])


def sufficiency_words(name: str, suff: dict) -> str:
    """One line: the share its heads keep, or why none is measured (``SENTENCES["sufficiency"]``)."""
    who = f"sufficiency of the {name.replace('_', ' ')} ({', '.join(suff['heads'])})"
    if suff.get("share") is None:
        return f"{who}: none measured: {suff['refused']}"
    return (f"{who}: every other head mean-ablated (the MLPs kept) keeps {suff['share']:.3f} +- {suff['se']:.3f} of "
            f"the progress ({suff['contexts']} contexts)")  # fmt: skip


def link_words(link: dict | None) -> str | None:
    """Where the discovered circuit is (``SENTENCES["circuit_link"]``): its path if the file exists, else the
    command that writes it."""
    if not link:
        return None
    if link.get("json"):
        return f"the discovered circuit (the edges between these heads): {link['json']} ({link['command']})"
    return f"the discovered circuit (the edges between these heads): not computed for this model yet; {link['command']} writes it"


def summary(r: dict) -> str:
    lines = [
        f"NLL, progress, ablation and patching {common.positions_words(r['positions'], r['trained_on'])}",
        f"{'':16s}{'NLL':>8s}{'gap':>9s}{'parent acc':>12s}{'TV to BMA':>11s}",
        f"{'model':16s}{r['nll']:8.4f}{r['nll'] - r['nll_bma']:+9.4f}{'':>12s}{'':>11s}",
        f"{'BMA':16s}{r['nll_bma']:8.4f}{0:+9.4f}{r['acc_bma']:12.3f}{0:11.3f}",
        (
            f"{'uniform-parent':16s}{r['nll_uniform']:8.4f}{r['nll_uniform'] - r['nll_bma']:+9.4f}"
            f"{r['acc_uniform']:12.3f}{r['tv_uniform']:11.3f}"
        ),
        "",
        (
            f"{'head':6s}{'cand mass':>10s}{'TV':>7s}{'parent acc':>11s}{'max copy':>9s}{'ablate dNLL':>12s}{'+- SE':>8s}"
            f"{'patch':>7s}{'+- SE':>7s}  role"
        ),
    ]
    for h in r["heads"]:
        patch_se = h.get("patching_se")
        lines.append(
            f"{h['label']:6s}{h['candidate_mass']:10.3f}{h['tv']:7.3f}{h['parent_acc']:11.3f}"
            f"{max(h['copy_mass'], default=float('nan')):9.3f}{h['ablation_dnll']:+12.4f}"
            f"{h.get('ablation_se', float('nan')):8.4f}{_fmt(h['patching_restored']):>7s}"
            f"{'' if patch_se is None else f'{patch_se:.2f}':>7s}  {h['role']}"
        )
    if r.get("patching_refused"):
        lines.append(f"patching: no shares ({r['patching_refused']})")
    lines += ["", "role profile: attention mass from demonstration / target queries"]
    lines.append(f"{'head':6s}" + "".join(f"{c[:13]:>14s}" for c in CATEGORIES))
    for h in r["heads"]:
        cells = (h["role_profile"][c] for c in CATEGORIES)
        lines.append(f"{h['label']:6s}" + "".join(f"{_pair(v):>14s}" for v in cells))
    lines.append("")
    if r["on_plateau"] is not None:
        lines.append(f"{r['kind']} model: progress from the plateau to BMA {_progress(r)} ({r['n_contexts']} contexts, seed {r.get('seed', 0)}; ablation, patching "
                     f"and sufficiency on the first {r['intervention_contexts']}; analyses.circuit samples its own, "
                     "so the two agree within their standard errors, not to the digit)")  # fmt: skip
    est = r.get("estimated")
    if est:
        lines.append(
            f"per-head ablation and patching: exact runs of all {len(r['heads'])} heads would take "
            f"{est['exact_flops']:.2g} FLOPs, more than the bound of {est['bound_flops']:.2g} "
            f"(models.interp.inspection.WORK_BOUND): {len(est['heads'])} heads are first-order estimates "
            f"({est['method']}); measured exactly: {', '.join(est['exactly']) or 'none'}"
        )
    lines.append(circuit_text(r))
    lines.append("thresholds behind the verdict: " + ", ".join(f"{k} {v:g}" for k, v in r["thresholds"].items()))
    if r["on_plateau"] is False:
        lines.append(
            f"paper's circuit, parent-selecting heads: {', '.join(r['parent_selecting']) or 'not found'} "
            f"(bar: parent acc >= {r['parent_acc_bar']:.3f})"
        )
    copyers = ", ".join(f"{k}->demo {v}" for k, v in r["copyers"].items())
    none = f"not found (no head puts >= {r['thresholds']['copy_mass']:g} on position h of one demonstration)"
    lines.append("paper's circuit, copyers: " + (copyers or none))
    for name, suff in r.get("sufficiency", {}).items():
        lines.append(sufficiency_words(name, suff))
    if r.get("inputs"):
        estimated = [k for k, h in r["inputs"].items() if h.get("estimated")]
        note = f"; estimated by attribution patching: {', '.join(estimated)}" if estimated else ""
        lines.append(
            "through which input each last-layer head acts (every edge into it patched from the corrupted run, "
            f"{r['intervention_contexts']} contexts{note}):"
        )
        for label, h in r["inputs"].items():
            verdict_ = {"values": POOLING, "keys/queries": "selects through its keys/queries"}.get(h["through"], "")
            lines.append(f"  {through_words(label, r['inputs'])}{'  -> ' + verdict_ if verdict_ else ''}")
    lines += sequence_text(r)
    link = link_words(r.get("circuit_link"))
    if link:
        lines.append(link)
    return "\n".join(lines)


def circuit_link(checkpoint: str | None, digest: str) -> dict:
    """Where ``analyses.circuit`` has written this model's circuit: the committed ``figures/circuit.json``
    when its checkpoint hash is this model's, else the folder ``python -m analyses.circuit --checkpoint X``
    writes by default; ``json`` is that path if the file exists (relative to the current folder when under it,
    else absolute), else None."""
    command = "python -m analyses.circuit" + ("" if checkpoint is None else f" --checkpoint {checkpoint}")
    committed = common.FIGURES_DIR / "circuit.json"
    try:
        path = committed if json.loads(committed.read_text()).get("checkpoint_hash") == digest else None
    except (OSError, ValueError):
        path = None
    path = path or common.default_out(checkpoint) / "circuit.json"
    return {"command": command, "json": shown_path(path) if path.is_file() else None}


def shown_path(path: Path) -> str:
    """``path`` relative to the current folder if it lies under it, else absolute: a path a reader can open."""
    path = path.resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _pair(v: list[float]) -> str:
    return "/".join("-" if x != x else f"{x:.2f}" for x in v)


def figures(result: common.Result) -> dict:
    r = result.data
    import matplotlib.pyplot as plt
    import numpy as np

    n = result.config.n_contexts
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
    fig, axes = plt.subplots(1, 3, figsize=(max(9, 0.5 * len(labels) + 6), 3.8), layout="constrained")
    axes[0].bar(x, [h["parent_acc"] for h in r["heads"]], color="C0")
    bma = axes[0].axhline(r["acc_bma"], color="k", label="BMA")
    plateau = axes[0].axhline(r["acc_uniform"], color="C3", ls="--", label="uniform-parent plateau")
    axes[0].set(ylabel="parent accuracy", ylim=(0, 1.02))
    axes[0].set_title("attention's argmax is the true parent", fontsize=10)
    axes[1].bar(x, [h["tv"] for h in r["heads"]], color="C1")
    axes[1].axhline(r["tv_uniform"], color="C3", ls="--")
    axes[1].set(ylabel="TV to BMA posterior")
    axes[1].set_title("candidate attention vs BMA", fontsize=10)
    axes[2].bar(x, [h["candidate_mass"] for h in r["heads"]], color="C2")
    axes[2].set(ylabel="attention mass", ylim=(0, 1.02))
    axes[2].set_title("mass on candidate parents", fontsize=10)
    for ax in axes:
        ax.set_xticks(x, labels, rotation=90, fontsize=8)
        ax.set_xlabel("head", fontsize=9)
    fig.legend(handles=[bma, plateau], fontsize=9, loc="outside lower center", ncol=2, frameon=False)
    fig.suptitle(
        f"{r['kind']} model, {n} contexts: NLL gap to BMA {r['nll'] - r['nll_bma']:+.4f} "
        f"(plateau {r['nll_uniform'] - r['nll_bma']:+.4f}); {verdict_text}",
        fontsize=12,
    )
    out["inspect_heads"] = fig

    copy = np.array([h["copy_mass"] for h in r["heads"]])
    fig, ax = plt.subplots(figsize=(0.45 * copy.shape[1] + 2.5, 0.3 * len(labels) + 1.5), layout="constrained")
    ax.set(title=f"Attention to x_h of demonstration l\nfrom the query predicting x_h ({n} ctx)")
    if copy.shape[1]:
        # The scale is the meaning, 0 (no copying) to 1 (all of it), so that a faint 0.08 reads as faint; each
        # cell prints its mass, and the colour bar marks the copyer bar.
        im = ax.imshow(copy, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        ax.grid(False)
        for (i, j), v in np.ndenumerate(copy):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="k" if v > 0.6 else "w")
        ax.set_yticks(x, labels, fontsize=8)
        ax.set_xticks(range(copy.shape[1]))
        ax.set(xlabel="demonstration l", ylabel="head")
        bar = fig.colorbar(im, ax=ax, label="attention mass")
        bar.ax.axhline(r["thresholds"]["copy_mass"], color="w", lw=2)
        bar.ax.text(1.1, r["thresholds"]["copy_mass"], "copyer", transform=bar.ax.get_yaxis_transform(),
                    va="bottom", ha="left", fontsize=7)  # fmt: skip
    else:  # one sequence per context (the peers' tasks)
        ax.text(0.5, 0.5, "no demonstrations (L = 0):\nnothing to copy", ha="center", va="center")
        ax.axis("off")
    out["inspect_copy"] = fig

    fig, axes = plt.subplots(1, 2, figsize=(max(8, 0.4 * len(labels) + 4), 3.4), layout="constrained")

    def column(key: str):  # a missing value (no share; an older JSON without SEs): no bar, no error bar
        return np.array([np.nan if h.get(key) is None else h[key] for h in r["heads"]], float)

    bars = {"lw": 1, "capsize": 2}
    axes[0].bar(x, column("ablation_dnll"), yerr=2 * column("ablation_se"), color="C4", error_kw=bars)
    axes[0].axhline(0, color="k", lw=0.8)
    axes[0].set(ylabel="NLL change (nats)")
    axes[0].set_title("mean-ablating the head's output", fontsize=10)
    axes[1].bar(x, column("patching_restored"), yerr=2 * column("patching_se"), color="C5", error_kw=bars)
    axes[1].axhline(0, color="k", lw=0.8)
    axes[1].set(ylabel="restored (corrupted 0, clean 1)")
    axes[1].set_title("patching its clean output into a corrupted run", fontsize=10)
    if r.get("patching_refused"):
        axes[1].text(0.5, 0.5, "no share: the corruption changes\nthe NLL by less than 2 SE", ha="center",
                     va="center", transform=axes[1].transAxes)  # fmt: skip
    estimated = set(r.get("estimated", {}).get("heads", []))
    for ax in axes:
        ax.set_xticks(x, labels, rotation=90, fontsize=8)
        ax.set_xlabel("head", fontsize=9)
        for bar, label in zip(ax.patches, labels):
            if label in estimated:  # beyond the work bound: a first-order estimate, not a run
                bar.set(hatch="////", alpha=0.5)
    note = " (hatched: estimated by attribution patching)" if estimated else ""
    fig.suptitle(
        f"Interventions per head, {r['intervention_contexts']} contexts "
        f"(clean NLL {r['nll_clean']:.4f}, corrupted {r['nll_corrupted']:.4f}); error bars +- 2 SE{note}",
        fontsize=12,
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


def _role_words(role: str) -> str:
    """A head's role for a row label: the words before its numbers (``role [demonstration: ...]``), with
    any parenthesis the cut opened closed again."""
    words = role.split(" [")[0]
    return words + ")" * (words.count("(") - words.count(")"))


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
    ylabels = ["\n".join(textwrap.wrap(f"{h['label']}: {_role_words(h['role'])}", 46)) for h in heads]
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
                    ax.text(j, i, f"{block[i, j]:.2f}", ha="center", va="center", fontsize=9,
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
        patched = "-" if h["patching_restored"] is None else f"{round(h['patching_restored'], 2) + 0.0:.2f}"
        ax.text(max(v, 0), yi, f" {v:+.3f} | {patched}", va="center", fontsize=10,
                fontweight="bold" if h["label"] in carriers else "normal")  # fmt: skip
    ax.set_xlim(0, max(dnll) * 1.9 if max(dnll) > 0 else 1)  # room for the notes beside the longest bar
    ax.set_xlabel("mean-ablation NLL change (nats)")
    ax.set_title("causal weight:\nablation (nats) | patching share\nrestored; red: carries the computation", fontsize=11)
    if r["on_plateau"] is None:
        title = "no verdict (BMA ~ plateau)"
    elif r["on_plateau"]:
        title = f"{plateau_words(r)}: no head credited"
    else:
        circuit = "the paper's circuit" if r["paper_circuit"] else "the paper's circuit absent"
        title = f"progress {r['progress']:.2f}, {circuit}; carrying it: {', '.join(r['carriers'])}"
    words = "; ".join(" ".join(CATEGORY_NAMES.get(c, c).split()) for c in left_out)
    note = f"\n(columns left out, as no head attends there: {words})" if left_out else ""
    fig.suptitle(f"{r['kind']} model, {n} contexts: {title}{note}", fontsize=12)
    return fig


def compute(subject, config: Config) -> dict:
    """The measurement (``models.interp.inspection.inspect_subject``) and where this model's circuit is."""
    r = inspect_subject(subject, config.n_contexts, config.seed, positions=subject.scored_positions(config.positions))
    r["circuit_link"] = circuit_link(subject.name, subject.hash)
    return r


ANALYSIS = common.register(globals())
