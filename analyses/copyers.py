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

import numpy as np
import torch

from analyses import common
from probes import copy_mass, demonstration_mass, head_assignment

NAME = "copyers"
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


def figures(res: dict, args):
    import matplotlib.pyplot as plt

    K, H2 = res["w_H"].shape
    H = (H2 + 1) // 2
    L = res["w_L"].shape[1] - 1
    fig, axes = plt.subplots(
        1, 4, figsize=(17, 0.35 * K + 2.2), gridspec_kw={"width_ratios": [2 * H - 1, L + 1, L + 1, L + 1]}
    )
    heads = [f"{h} → d{l}" for h, l in zip(res["heads"], res["head_demo"])]
    dup_heads = {h for hs in res["duplicates"].values() for h in hs}
    panels = [
        (res["w_H"], "w^H (offset h' − h)", [str(o) for o in range(-(H - 1), H)], "RdBu_r", True),
        (res["w_L"], "w^L (demonstration; T = target prefix)", [str(l) for l in range(L)] + ["T"], "RdBu_r", True),
        (res["demonstration_mass"], "attention mass per example", [str(l) for l in range(L)] + ["T"], "viridis", False),
        (res["copy_mass"], "same-position copy mass", [str(l) for l in range(L)] + ["T"], "viridis", False),
    ]
    for ax, (m, title, xt, cmap, centred) in zip(axes, panels):
        m = m.numpy()
        kw = {"vmin": -np.abs(m).max(), "vmax": np.abs(m).max()} if centred else {"vmin": 0, "vmax": 1}
        im = ax.imshow(m, cmap=cmap, aspect="auto", **kw)
        ax.grid(False)
        ax.set_xticks(range(len(xt)), xt, fontsize=6, rotation=90 if len(xt) > 15 else 0)
        ax.set_yticks(range(K), heads, fontsize=7)
        for t, h in zip(ax.get_yticklabels(), res["heads"]):
            if h in dup_heads:
                t.set_color("C3")
                t.set_fontweight("bold")
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.8)
    flag = f"DUPLICATES: {res['duplicates']}" if res["duplicates"] else "all heads copy distinct demonstrations"
    fig.suptitle(
        f"{args.subject_name}: copyer heads; {res['distinct_demos']}/{K} distinct demonstrations, "
        f"min purity {min(res['purity']):.3f}, min same-position copy mass {min(res['copy_purity']):.3f}; {flag}",
        fontsize=10,
        color="C3" if res["duplicates"] else "k",
    )
    fig.tight_layout()
    return fig


def compute(subject, args) -> dict:
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


REQUIRES = frozenset({common.CONTENT_FREE_COPYERS})  # what it needs of its subject
ANALYSIS = common.register(globals())
