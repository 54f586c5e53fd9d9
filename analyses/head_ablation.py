"""Copyer-head ablation: knock out the copy of one demonstration, compare with BMA that never saw it.

    python -m analyses.head_ablation                              # the shipped checkpoint
    python -m analyses.head_ablation --checkpoint theorem1:beta=50

The mechanism (docs/paper.md section 3): copyer head k writes a soft copy of ONE demonstration l(k) into
residual subspace k+1, and the layer-2 score sums a ``log pi`` term per copy, which is Lemma 1's sum
over demonstrations. So removing head k's copy should turn the model into BMA computed without
demonstration l(k). The demonstration is read from the measured head assignment
(``probes.head_assignment`` of ``model.copyer_pattern()``), never assumed to be l = k.

Ablations of ``blocks.0.attn.hook_z[:, :, k]`` (the copy u_h^k at every target position):
- zero: u^k = 0. A zero copy adds exactly 0 to every layer-2 score ``k_h'^T W_KQ q_h`` (key AND query
  side), which is what dropping demonstration l(k) from the Lemma 1 sum does: for the Theorem 1 model
  this is BMA-without-l(k) exactly (up to e^{-beta}).
- mean: u^k = its mean over the evaluated contexts, per position h. The mean copy is the token marginal
  at position h; its score term ``m_h'^T W m_h`` varies with the candidate h', so it biases the
  attention by position and is NOT BMA without the demonstration. In a trained model the value side
  also reads the copies (small copy rows of W_OV): zeroing copies shifts the value distributions,
  replacing them by their mean does not, so on the NLL mean ablation tracks BMA more closely.

Heads are then ablated cumulatively in order of importance (the NLL increase of the single-head zero
ablation), against BMA conditioned on the demonstrations that are still copied.

Controls (``blocks.1.attn.hook_q`` / ``hook_k`` subspace 0, the token x_h):
- query side: structurally zero (the query never reads x_h), so ablating it must change nothing;
- key side: the token of the candidate parent x_h', which the Theorem 1 construction ignores (its
  W_KQ rows are zero) but a trained W_KQ may use.

Measured for every ablation: NLL of the target tokens, its gap to BMA, parent-identification accuracy
and the TV distance of the ``blocks.1`` attention to the full BMA posterior and to BMA without the
ablated demonstrations.
"""

from __future__ import annotations

from analyses import common
from models.plumbing.io import UsageError

NAME = "head_ablation"
REQUIRES = frozenset({common.DISENTANGLED, common.MARKOV_TASK})  # what it needs of its subject


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    n_contexts: int = common.n_contexts(2048)


common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import math

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from models.interp.interventions import ablate, ablate_subspace
from models.interp.subject import DisentangledSubject, head_label
from models.plumbing.progress import progress as progress_bar
from models.training.evaluate import output_and_pattern
from probes import bma_posterior, bma_predictive, head_assignment, mean_tv, parent_accuracy, target_nll

HOOK_Z = "blocks.0.attn.hook_z"  # [batch, H, K, d]
HOOK_Q, HOOK_K = "blocks.1.attn.hook_q", "blocks.1.attn.hook_k"  # [batch, H, 1, (K+1)d]
PATTERN = "blocks.1.attn.hook_pattern"  # [batch, 1, H, H]
KINDS = ("zero", "mean")
FIGURES = {
    f"{NAME}_per_head.png": "each copyer head zero- and mean-ablated: NLL increase (model vs BMA without the "
    "demonstration the head copies) and TV of the layer-2 attention to BMA with and without that demonstration; "
    "controls: the token subspace of the layer-2 query (changes nothing) and key",
    f"{NAME}_cumulative.png": "copyer heads ablated cumulatively, most important first: NLL, parent-identification "
    "accuracy and attention TV of the model against BMA conditioned on the demonstrations still copied (mean ablation "
    "follows that BMA; zero ablation's NLL drifts above it), and the attention's TV to full BMA beside it",
}
CLAIM_THEOREM1_TV = 1e-4  # zero-ablated Theorem 1 model vs BMA without the demonstration
CLAIM_MARGIN = 0.02  # trained model: TV to BMA-without <= intact TV to BMA + this


@torch.no_grad()
def run_ablated(subject: DisentangledSubject, tokens: Int[Tensor, "batch T"], hooks: list) -> tuple[Tensor, Tensor]:
    """Log-probs ``[batch, H, d]`` and the ``blocks.1`` attention ``[batch, H, H]`` (float64, CPU) under
    ``hooks`` (a list of (hook name, function)); the hooks are removed afterwards, also on error."""
    with subject.model.hooks(fwd_hooks=hooks):
        return output_and_pattern(subject.model, tokens)


class BMAReference:
    """BMA conditioned on a subset of the demonstrations, computed once per subset."""

    def __init__(self, task, tokens: Int[Tensor, "batch T"], parents: Int[Tensor, "batch H"]):
        self.task, self.tokens, self.parents, self._memo = task, tokens, parents, {}

    def __call__(self, dropped: frozenset = frozenset()) -> dict:
        """``posterior`` [batch,H,H], ``nll``, ``parent_acc`` of BMA without the ``dropped`` demos."""
        if dropped not in self._memo:
            t = self.task
            keep = [l for l in range(t.n_examples) if l not in dropped]
            post = bma_posterior(t.pi, self.tokens, t.n_examples, t.seq_len, demonstrations=keep)
            pred = bma_predictive(t.pi, self.tokens, t.n_examples, t.seq_len, t.root, demonstrations=keep, log=True)
            self._memo[dropped] = {
                "posterior": post,
                "nll": target_nll(pred, self.tokens),
                "parent_acc": parent_accuracy(post, self.parents),
                "n_demonstrations": len(keep),
            }
        return self._memo[dropped]


def measure(
    log_probs: Tensor,
    attention: Tensor,
    tokens: Tensor,
    parents: Tensor,
    bma: BMAReference,
    dropped: frozenset = frozenset(),
) -> dict:
    """NLL, parent accuracy, and gaps/TVs to full BMA and to BMA without the ``dropped`` demos."""
    full, without = bma(), bma(dropped)
    nll = target_nll(log_probs, tokens)
    attention = attention.double().cpu()
    return {
        "nll": nll,
        "nll_gap": nll - full["nll"],
        "nll_gap_without": nll - without["nll"],
        "parent_acc": parent_accuracy(attention, parents),
        "tv": mean_tv(attention, full["posterior"]),
        "tv_without": mean_tv(attention, without["posterior"]),
        "attention": attention,
    }


@torch.no_grad()
def head_ablation(
    subject: DisentangledSubject, tokens: Int[Tensor, "batch T"], parents: Int[Tensor, "batch H"], progress: bool = True
) -> dict:
    """Every ablation of the module docstring on ``tokens``; see the JSON keys in ``summarise``.

    Returns ``heads`` (per head: demonstration, purity, and ``zero``/``mean`` measurements),
    ``intact``, ``bma`` (full BMA), ``bma_without`` (per head), ``order`` (heads by importance),
    ``cumulative`` (per number of heads ablated: ``zero``/``mean`` measurements and the BMA that keeps
    the demonstrations still copied), ``controls`` and ``claims``.
    """
    model, task = subject.model, subject.task
    cfg = model.cfg
    K, L, d = cfg.n_copy_heads, cfg.n_examples, cfg.d_vocab
    if (task.n_examples, task.seq_len, task.d_vocab) != (L, cfg.seq_len, d):
        raise UsageError(
            f"task (L={task.n_examples}, H={task.seq_len}, d={task.d_vocab}) does not match the model "
            f"(L={L}, H={cfg.seq_len}, d={d})"
        )
    demos, purity = head_assignment(model.copyer_pattern().detach().cpu(), L)
    bma = BMAReference(task, tokens, parents)
    log_probs, cache = model.run_with_cache(tokens, names_filter=[HOOK_Z, HOOK_Q, HOOK_K, PATTERN])  # once: means too
    intact = measure(log_probs, cache[PATTERN][:, 0], tokens, parents, bma)
    means = {name: cache[name].mean(0) for name in (HOOK_Z, HOOK_Q, HOOK_K)}

    log: list = []  # every intervention run, for the JSON

    def ablate_heads(heads: list[int], kind: str) -> dict:
        out = run_ablated(subject, tokens, ablate(subject, 0, heads, kind, means[HOOK_Z], log))
        return measure(*out, tokens, parents, bma, frozenset(demos[k] for k in heads))

    bar = progress_bar(desc="ablations", total=2 * K + 2 * (K + 1) + 4, enabled=progress, leave=False)
    heads = []
    for k in range(K):
        heads.append({"head": head_label(0, k), "demonstration": demos[k], "purity": purity[k]})
        for kind in KINDS:
            heads[k][kind] = ablate_heads([k], kind)
            bar.update()
    order = sorted(range(K), key=lambda k: -(heads[k]["zero"]["nll"] - intact["nll"]))
    cumulative = []
    for n in range(K + 1):
        dropped = frozenset(demos[k] for k in order[:n])
        row = {
            "n_heads": n,
            "heads": [head_label(0, k) for k in order[:n]],
            "dropped": sorted(dropped),
            "bma": {key: bma(dropped)[key] for key in ("nll", "parent_acc", "n_demonstrations")},
        }
        for kind in KINDS:
            row[kind] = ablate_heads(order[:n], kind) if n else intact
            bar.update()
        cumulative.append(row)
    controls = {}
    for side, name in (("query", HOOK_Q), ("key", HOOK_K)):
        for kind in KINDS:
            lp, att = run_ablated(subject, tokens, ablate_subspace(name, slice(0, d), kind, means[name], log))
            controls[f"{side}_token_{kind}"] = {
                **measure(lp, att, tokens, parents, bma),
                "max_abs_log_prob_change": (lp - log_probs)[:, 1:].abs().max().item(),
                "tv_to_intact": mean_tv(att.double().cpu(), intact["attention"]),
            }
            bar.update()
    bar.close()
    bma_without = [
        {key: bma(frozenset([demos[k]]))[key] for key in ("nll", "parent_acc")}
        | {"tv_to_full": mean_tv(bma(frozenset([demos[k]]))["posterior"], bma()["posterior"])}
        for k in range(K)
    ]
    result = {
        "heads": heads,
        "intact": intact,
        "bma": {key: bma()[key] for key in ("nll", "parent_acc")},
        "bma_without": bma_without,
        "order": [head_label(0, k) for k in order],
        "cumulative": cumulative,
        "controls": controls,
        "distinct_demonstrations": len(set(demos)),
        "interventions": log,
    }
    result["claims"] = claims(result)
    return result


def claims(r: dict) -> dict:
    """The issue's claims, per ablation kind: Theorem 1 (TV to BMA-without <= 1e-4 for every head) and
    trained (TV to BMA-without <= intact TV + 0.02 and < TV to full BMA, for every head and on average)."""
    out = {"intact_tv": r["intact"]["tv"]}
    for kind in KINDS:
        without = np.array([h[kind]["tv_without"] for h in r["heads"]])
        full = np.array([h[kind]["tv"] for h in r["heads"]])
        out[kind] = {
            "mean_tv_without": without.mean(),
            "max_tv_without": without.max(),
            "mean_tv_full": full.mean(),
            "theorem1_exact": bool(without.max() <= CLAIM_THEOREM1_TV),
            "within_margin_every_head": bool((without <= r["intact"]["tv"] + CLAIM_MARGIN).all()),
            "closer_to_without_every_head": bool((without < full).all()),
            "within_margin_mean": bool(without.mean() <= r["intact"]["tv"] + CLAIM_MARGIN),
            "closer_to_without_mean": bool(without.mean() < full.mean()),
        }
    return out


def _strip(obj):
    """The result without the [batch, H, H] attention tensors (for the JSON)."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k != "attention"}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def plot(r: dict, n: int, subject_name: str):
    """Per-head bars (with the controls) and the cumulative curves; returns the two figures."""
    import matplotlib.pyplot as plt

    heads, intact = r["heads"], r["intact"]
    K = len(heads)
    x = np.arange(K)
    labels = [f"{h['head']}\n(demo {h['demonstration']})" for h in heads]
    fig1, axes = plt.subplots(1, 3, figsize=(17, 4.6), gridspec_kw={"width_ratios": [K, K, 4]})
    w = 0.27
    ax = axes[0]
    ax.bar(x - w, [h["zero"]["nll"] - intact["nll"] for h in heads], w, label="model, zero ablation")
    ax.bar(x, [h["mean"]["nll"] - intact["nll"] for h in heads], w, label="model, mean ablation")
    ax.bar(
        x + w,
        [b["nll"] - r["bma"]["nll"] for b in r["bma_without"]],
        w,
        color="k",
        alpha=0.6,
        label="BMA without that demonstration",
    )
    ax.set(xticks=x, xticklabels=labels, ylabel="NLL increase (nats)", title="NLL increase when one head is ablated")
    ax.set_ylim(top=1.35 * ax.get_ylim()[1])
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    ax = axes[1]
    ax.bar(x - w, [h["zero"]["tv_without"] for h in heads], w, label="zero abl. vs BMA without demo")
    ax.bar(x, [h["mean"]["tv_without"] for h in heads], w, label="mean abl. vs BMA without demo")
    ax.bar(x + w, [h["zero"]["tv"] for h in heads], w, color="w", edgecolor="C0", hatch="///",
           label="zero abl. vs full BMA")  # not grey: grey is the left panel's BMA  # fmt: skip
    ax.axhline(intact["tv"], color="C3", ls="--", lw=1, label=f"intact vs full BMA ({intact['tv']:.3f})")
    ax.axhline(intact["tv"] + CLAIM_MARGIN, color="C3", ls=":", lw=1, label="intact + 0.02 (claim bound)")
    tvs = [h[kind][key] for h in heads for kind in KINDS for key in ("tv", "tv_without")]
    log = min(tvs) < 1e-2 * max(tvs)  # Theorem 1: exact zeros next to ~0.1
    ax.set(
        xticks=x,
        xticklabels=labels,
        title="Attention after ablation: TV to BMA",
        ylabel="mean TV of blocks.1 attention" + (" (log scale)" if log else ""),
        yscale="log" if log else "linear",
    )
    high = max(*tvs, intact["tv"] + CLAIM_MARGIN)
    if log:  # headroom for the legend above the highest bar or line; ticks only where a TV can be (<= 1)
        bottom = ax.get_ylim()[0]
        ax.set_ylim(bottom, high * 10 ** (0.45 * math.log10(high / bottom)))
        ax.set_yticks([t for t in ax.get_yticks() if bottom <= t <= 1])
    else:
        ax.set_ylim(top=high * 1.5)
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=7, loc="upper center", ncol=2)
    ax = axes[2]
    names = list(r["controls"])
    vals = [r["controls"][c]["tv_to_intact"] for c in names]
    ax.bar(range(len(names)), vals, color=["C2" if c.startswith("query") else "C4" for c in names])
    for i, v in enumerate(vals):  # the query side is exactly 0 by construction: say so, not "0.0e+00"
        ax.annotate("exactly 0" if v == 0 else f"{v:.2g}", (i, v), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.3 * max(vals) if max(vals) > 0 else 1e-3)
    ax.set(
        xticks=range(len(names)),
        xticklabels=[c.replace("_token_", "\n") for c in names],
        ylabel="mean TV to intact attention",
        title="Controls: token subspace\nof layer-2 query / key",
    )
    ax.tick_params(axis="x", labelsize=8)
    fig1.suptitle(f"Copyer-head ablation ({subject_name}, {n} contexts)")
    fig1.tight_layout()

    cum = r["cumulative"]
    ns = [c["n_heads"] for c in cum]
    # Four panels, each on its own linear scale: the attention's TV to the BMA it should follow (0.01-0.05)
    # apart from its TV to full BMA (up to ~0.6), so that neither flattens the other; one legend below.
    fig2, axes = plt.subplots(2, 2, figsize=(12, 8.6), layout="constrained")
    axes = axes.ravel()
    xlabel = "copyer heads ablated (most important first)"
    for ax, key, ylabel, title in ((axes[0], "nll", "NLL (nats)", "NLL of the target tokens"),
                                   (axes[1], "parent_acc", "parent-identification accuracy", "Parent identification")):  # fmt: skip
        ax.plot(ns, [c["zero"][key] for c in cum], "o-", color="C0", label="model, zero ablation")
        ax.plot(ns, [c["mean"][key] for c in cum], "s-", color="C1", label="model, mean ablation")
        ax.plot(ns, [c["bma"][key] for c in cum], "k--", label="BMA with the remaining demonstrations")
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax = axes[2]
    zero, mean = [c["zero"]["tv_without"] for c in cum], [c["mean"]["tv_without"] for c in cum]
    ax.plot(ns, zero, "o-", color="C0")
    ax.plot(ns, mean, "s-", color="C1")
    ax.axhline(intact["tv"], color="C3", ls="--", lw=1, label=f"intact model vs full BMA ({intact['tv']:.3f})")
    ax.axhline(intact["tv"] + CLAIM_MARGIN, color="C3", ls=":", lw=1, label=f"intact + {CLAIM_MARGIN} (claim bound)")
    ax.set_ylim(0, 1.25 * max(*zero, *mean, intact["tv"] + CLAIM_MARGIN))
    if zero[-1] < 1e-4:  # every copy zeroed: BMA with no demonstration, which the construction meets exactly
        ax.annotate(f"{zero[-1]:.0e}: no demonstration left", (ns[-1], zero[-1]), xytext=(-6, 8),
                    textcoords="offset points", ha="right", fontsize=8)  # fmt: skip
    ax.set(xlabel=xlabel, ylabel="mean TV of blocks.1 attention", title="Attention vs BMA with the remaining demos")
    ax = axes[3]
    ax.plot(ns, [c["zero"]["tv"] for c in cum], "o:", color="C0", ms=8, mfc="none", label="zero ablation vs full BMA")
    ax.plot(ns, [c["mean"]["tv"] for c in cum], "s:", color="C1", ms=4, label="mean ablation vs full BMA")
    ax.plot(ns, zero, "o-", color="C0", alpha=0.4)
    ax.plot(ns, mean, "s-", color="C1", alpha=0.4)
    ax.set_ylim(0, None)
    ax.set(xlabel=xlabel, ylabel="mean TV of blocks.1 attention",
           title="... and vs full BMA (dotted), the left panel's curves solid")  # fmt: skip
    handles = [h for a in (axes[0], axes[2], axes[3]) for h in a.get_legend_handles_labels()[0]]
    fig2.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=9, frameon=False)
    fig2.suptitle(f"Cumulative copyer-head ablation ({subject_name}, {n} contexts)")
    return fig1, fig2


def summary(r: dict) -> str:
    """The short text summary printed on stdout."""
    i, c = r["intact"], r["claims"]
    lines = [
        (
            f"intact: NLL {i['nll']:.4f} (gap to BMA {i['nll_gap']:+.4f}), parent acc {i['parent_acc']:.4f} "
            f"(BMA {r['bma']['parent_acc']:.4f}), TV to BMA {i['tv']:.4f}"
        ),
        "head  demo  zero: dNLL  TV->BMA-without  TV->BMA | mean: dNLL  TV->BMA-without  TV->BMA",
    ]
    for h in r["heads"]:
        z, m = h["zero"], h["mean"]
        lines.append(
            f"{h['head']:5s} {h['demonstration']:4d}  {z['nll'] - i['nll']:+10.4f}  {z['tv_without']:15.4g}  "
            f"{z['tv']:7.4f} | {m['nll'] - i['nll']:+10.4f}  {m['tv_without']:15.4g}  {m['tv']:7.4f}"
        )
    exact = c["intact_tv"] <= CLAIM_THEOREM1_TV  # the intact model is BMA itself: Theorem 1's construction
    lines.append(
        f"expected of this model (intact TV to BMA {c['intact_tv']:.4g}, "
        + (
            f"<= {CLAIM_THEOREM1_TV:g}: exact, as Theorem 1's construction): zero ablation gives BMA without the "
            f"copied demonstration, TV <= {CLAIM_THEOREM1_TV:g} (mean ablation need not)"
            if exact
            else f"> {CLAIM_THEOREM1_TV:g}: a trained model, so Theorem 1's exact TV <= {CLAIM_THEOREM1_TV:g} is not "
            f"expected): every head's TV to BMA-without <= intact + {CLAIM_MARGIN}, and below its TV to full BMA"
        )
    )
    yes = {True: "yes", False: "NO"}
    for kind in KINDS:
        k = c[kind]
        checks = (
            f"TV <= {CLAIM_THEOREM1_TV:g} every head: {yes[k['theorem1_exact']]}"
            if exact and kind == "zero"
            else f"<= intact + {CLAIM_MARGIN} every head: {yes[k['within_margin_every_head']]}, "
            f"< TV to full BMA every head: {yes[k['closer_to_without_every_head']]}"
        )
        lines.append(
            f"{kind} ablation: mean TV to BMA-without {k['mean_tv_without']:.4g} (max {k['max_tv_without']:.4g})"
            f" vs to full BMA {k['mean_tv_full']:.4g}; " + checks
        )
    last = r["cumulative"][-1]
    lines.append(
        f"all {last['n_heads']} heads zero-ablated: NLL {last['zero']['nll']:.4f} vs BMA with no "
        f"demonstrations {last['bma']['nll']:.4f}; TV {last['zero']['tv_without']:.4g}"
    )
    for name, ctl in r["controls"].items():
        lines.append(
            f"control {name}: max |d log p| {ctl['max_abs_log_prob_change']:.3g}, TV to intact attention "
            f"{ctl['tv_to_intact']:.3g}, NLL {ctl['nll']:.4f}, TV to BMA {ctl['tv']:.4f}"
        )
    return "\n".join(lines)


def compute(subject: DisentangledSubject, config: Config) -> dict:
    tokens, parents = common.sample_contexts(subject.task, config.n_contexts, config.seed)
    return head_ablation(subject, tokens.to(subject.device), parents)


def figures(result: common.Result) -> dict:
    r = result.data
    per_head, cumulative = plot(r, result.config.n_contexts, result.title)
    return {f"{NAME}_per_head": per_head, f"{NAME}_cumulative": cumulative}


record = _strip


ANALYSIS = common.register(globals())
