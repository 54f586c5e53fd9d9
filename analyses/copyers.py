"""What does each copyer head copy? w^H and w^L per head, the head -> demonstration assignment and
its purity, and a loud flag when two heads copy the same demonstration.

    python -m analyses.copyers
    python -m analyses.copyers --checkpoint theorem1:beta=50

The copyer pattern is content-free, so everything here is read off the weights (no contexts are
sampled; --n-contexts is accepted and unused). Purity of a head: the attention mass it puts on its
assigned demonstration (``probes.demonstration_mass``, averaged over target positions) and the part of
that mass on the SAME position h (``probes.copy_mass``: an exact copy of x_h^l).
"""

from __future__ import annotations

from analyses import common

NAME = "copyers"
REQUIRES = frozenset({common.CONTENT_FREE_COPYERS})  # what it needs of its subject


class Config(common.Config):
    """What ``run`` computes: nothing but the seed (everything is read off the weights)."""


common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import numpy as np
import torch

from probes import copy_mass, demonstration_mass, head_assignment

FIGURES = {
    "copyers.png": (
        "w^H and w^L per copyer head, attention mass per example and same-position copy mass, heads labelled with the demonstration they copy; heads that duplicate one demonstration are drawn in red."
    ),
}


@torch.no_grad()
def copyer_report(model) -> dict:
    """Per head k: the demonstration it copies, its demonstration and same-position copy mass, and the
    duplicates: ``{demonstration: [heads]}`` for every demonstration copied by two or more heads, plus
    the demonstrations no head copies.

    Returns also ``w_H`` [K, 2H-1] (offset h'-h = -(H-1)..H-1), ``w_L`` [K, L+1] (last: target prefix),
    ``demonstration_mass`` [K, L+1] and ``copy_mass`` [K, L+1].
    """
    L, K = model.cfg.n_examples, model.cfg.n_copy_heads
    pattern = model.copyer_pattern().cpu()
    demos, purity = head_assignment(pattern, L)
    mass, same = demonstration_mass(pattern, L), copy_mass(pattern, L)
    by_demo: dict[int, list[str]] = {}
    for k, l in enumerate(demos):
        by_demo.setdefault(l, []).append(f"L0H{k}")
    duplicates = {l: heads for l, heads in sorted(by_demo.items()) if len(heads) > 1}
    return {
        "heads": [f"L0H{k}" for k in range(K)],
        "head_demo": demos,
        "purity": purity,
        "copy_purity": [same[k, demos[k]].item() for k in range(K)],
        "target_mass": mass[:, L].tolist(),
        "duplicates": duplicates,
        "uncopied_demos": [l for l in range(L) if l not in by_demo],
        "distinct_demos": len(by_demo),
        "w_H": model.blocks[0].attn.w_H.detach().cpu().double(),
        "w_L": model.blocks[0].attn.w_L.detach().cpu().double(),
        "demonstration_mass": mass,
        "copy_mass": same,
    }


def duplicate_warning(res: dict) -> str | None:
    """The loud one-line flag for heads that copy the same demonstration (None if all distinct)."""
    if not res["duplicates"]:
        return None
    parts = "; ".join(f"{' and '.join(h)} copy demonstration {l}" for l, h in res["duplicates"].items())
    return (
        f"WARNING: DUPLICATE COPYERS: {parts}; demonstrations {res['uncopied_demos']} are copied by no head "
        f"({res['distinct_demos']} distinct of {len(res['heads'])} heads)"
    )


def figures(result: common.Result):
    res = result.data
    import matplotlib.pyplot as plt

    K, H2 = np.shape(res["w_H"])  # tensors from compute, lists from a saved JSON: redrawn alike
    H = (H2 + 1) // 2
    L = np.shape(res["w_L"])[1] - 1
    fig, axes = plt.subplots(
        1, 4, figsize=(17, 0.35 * K + 2.6), gridspec_kw={"width_ratios": [2 * H - 1, L + 1, L + 1, L + 1]},
        sharey=True, layout="constrained",
    )  # fmt: skip
    heads = [f"{h} → d{l}" for h, l in zip(res["heads"], res["head_demo"])]
    dup_heads = {h for hs in res["duplicates"].values() for h in hs}
    demos = [str(l) for l in range(L)] + ["T"]
    panels = [
        (res["w_H"], "score by offset (w^H)", "offset h' − h", [str(o) for o in range(-(H - 1), H)], "RdBu_r", True),
        (res["w_L"], "score by demonstration (w^L)", "demonstration l (T: the target)", demos, "RdBu_r", True),
        (res["demonstration_mass"], "attention mass per demonstration", "demonstration l (T: the target)", demos, "viridis", False),
        (res["copy_mass"], "same-position copy mass", "demonstration l (T: the target)", demos, "viridis", False),
    ]  # fmt: skip
    for ax, (m, title, xlabel, xt, cmap, centred) in zip(axes, panels):
        m = np.asarray(m)
        kw = {"vmin": -np.abs(m).max(), "vmax": np.abs(m).max()} if centred else {"vmin": 0, "vmax": 1}
        im = ax.imshow(m, cmap=cmap, aspect="auto", **kw)
        ax.grid(False)
        step = 1 if len(xt) <= 15 else 2  # every other offset when there are many (0 kept): upright, readable
        shown = [i for i, t in enumerate(xt) if not t.lstrip("-").isdigit() or int(t) % step == 0]
        ax.set_xticks(shown, [xt[i] for i in shown], fontsize=8)
        ax.set_xlabel(xlabel, fontsize=9)
        ax.set_title(title, fontsize=10)
        fig.colorbar(im, ax=ax, shrink=0.8, label="score" if centred else "mass")
    axes[0].set_yticks(range(K), heads, fontsize=8)
    axes[0].set_ylabel("copyer head → the demonstration it copies", fontsize=9)
    for t, h in zip(axes[0].get_yticklabels(), res["heads"]):
        if h in dup_heads:
            t.set_color("C3")
            t.set_fontweight("bold")
    flag = f"DUPLICATES: {res['duplicates']}" if res["duplicates"] else "all heads copy distinct demonstrations"
    fig.suptitle(
        f"{result.title}: copyer heads; {res['distinct_demos']}/{K} distinct demonstrations, "
        f"min purity {min(res['purity']):.3f}, min same-position copy mass {min(res['copy_purity']):.3f}; {flag}",
        fontsize=10,
        color="C3" if res["duplicates"] else "k",
    )
    return fig


def compute(subject, config: Config) -> dict:
    res = copyer_report(subject.model)
    res["warning"] = duplicate_warning(res)
    return res


def summary(res: dict) -> str:
    lines = [f"{NAME}: {res['distinct_demos']} distinct demonstrations for {len(res['heads'])} heads"]
    for h, l, p, c in zip(res["heads"], res["head_demo"], res["purity"], res["copy_purity"]):
        lines.append(f"  {h} -> demonstration {l}: mass {p:.3f}, same-position copy {c:.3f}")
    if res["warning"]:
        lines.append("!" * 80 + "\n" + res["warning"] + "\n" + "!" * 80)
    return "\n".join(lines)


ANALYSIS = common.register(globals())
