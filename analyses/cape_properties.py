"""The three properties CAPE (arXiv 2509.16629) claims for its causality-induced rotary encoding, measured
on random DAGs whose structure is known.

    python -m analyses.cape_properties                     # 40 graphs (half trees, half DAGs), M=15, n=4
    python -m analyses.cape_properties --n-contexts 100 --nodes 20 --dim 8

``--n-contexts`` is the number of random graphs (``cape.embedding.random_tree`` / ``random_dag``);
it takes no ``--checkpoint``. Each graph is embedded (``cape.embedding.embed``, seeded), turned
into angles ``phi = (pi/4) e`` and scored with ``cape.attention.rotary_scores``.

1. Causal distance: ``S[m, n] = E_q q^T R(phi_n - phi_m) q`` for q ~ N(0, I) (Monte Carlo over
   ``--n-queries`` vectors through ``rotary_scores``; closed form ``2 sum_b cos(phi_nb - phi_mb)``) against
   the hop distance in the skeleton: Spearman per graph; control: the same with angles drawn at random.
2. Causal generality: the Poincare norm ``|e_v|`` against depth (specificity, expected > 0) and against
   the generality score ``pi_v`` (reversed PageRank, expected < 0); and a node's mean score to the others
   against ``pi_v``.
3. Feature order: embedding ``A[perm][:, perm]`` (a) from the permuted initial points: exact equivariance,
   ``max |p' - p[perm]|`` and ``max |pattern' - pattern[perm][:, perm]|`` of a ``CapeAttention`` layer on permuted
   features; (b) from a fresh seeded initialisation (what a user gets): Spearman between the score matrices,
   compared with re-embedding the unpermuted graph with a different seed.
"""

from __future__ import annotations

from analyses import common

NAME = "cape_properties"
REQUIRES = None  # its own synthetic tasks: no --checkpoint


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    n_contexts: int = common.n_contexts(40, "random graphs to measure", minimum=2)
    # sizes bounded by the memory they need, checked before any work (compute)
    nodes: int = common.option(15, "features (DAG nodes) per graph", minimum=3)
    dim: int = common.option(4, "hyperbolic dimension n; d_head = 2n", minimum=1)
    n_queries: int = common.option(256, "random q per score", minimum=1)
    n_perm: int = common.option(20, "graphs that get the permutation test (at most n_contexts)", minimum=1)

common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import numpy as np
import torch

from cape.attention import CapeAttention, rotary_scores
from cape.embedding import depth, embed, generality, hop_distance, initial_points, random_dag, random_tree
from models.plumbing.io import UsageError, check_memory
from models.plumbing.progress import progress as progress_bar

FIGURES = {
    "cape_distance.png": "CAPE property 1: rotary attention score (q = k, averaged over random q) against causal hop distance on random trees and DAGs, per-graph Spearman against a random-angle control.",
    "cape_generality.png": "CAPE property 2: Poincare norm of each feature's embedding against its depth and against its causal generality (reversed PageRank), per-graph Spearman.",
    "cape_permutation.png": "CAPE property 3: re-embedding a graph with its features permuted: exact equivariance from permuted initial points, and score agreement from a fresh initialisation against seed-to-seed variation.",
}


def spearman(x, y) -> float:
    """Spearman rank correlation (average ranks for ties); nan if either side is constant."""
    rx, ry = _ranks(np.asarray(x, float)), _ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(a: np.ndarray) -> np.ndarray:
    order = np.argsort(a, kind="stable")
    r = np.empty(len(a))
    r[order] = np.arange(len(a))
    for v in np.unique(a):  # average ties
        tie = a == v
        r[tie] = r[tie].mean()
    return r


def mean_scores(phi: torch.Tensor, n_queries: int, generator: torch.Generator) -> np.ndarray:
    """``E_q q^T R(phi_n - phi_m) q`` [M,M] over ``n_queries`` Gaussian q (the same q at every feature)."""
    q = torch.randn(n_queries, 1, 2 * phi.shape[1], dtype=torch.float64, generator=generator).expand(
        -1, phi.shape[0], -1
    )
    return rotary_scores(q, q, phi).mean(0).numpy()


def measure(
    n_graphs: int, nodes: int, dim: int, n_queries: int, n_perm: int, seed: int = 0, progress: bool = False
) -> dict:
    """The numbers of the three figures (see the module docstring); the sizes' defaults are the CLI's
    (``add_flags``)."""
    if n_graphs < 2 or nodes < 3 or dim < 1 or n_queries < 1 or n_perm < 0:
        raise UsageError(
            f"need n_graphs >= 2, nodes >= 3, dim >= 1, n_queries >= 1, n_perm >= 0; got {n_graphs}, {nodes}, {dim}, {n_queries}, {n_perm}"
        )
    g = torch.Generator().manual_seed(seed)
    iu = np.triu_indices(nodes, 1)
    res = {"nodes": nodes, "dim": dim, "n_graphs": n_graphs, "n_queries": n_queries, "graphs": []}
    for i in progress_bar(range(n_graphs), "graphs", enabled=progress):
        kind = "tree" if i % 2 == 0 else "dag"
        A = random_tree(nodes, g) if kind == "tree" else random_dag(nodes, g)
        emb = embed(A, dim=dim, seed=seed + i)
        S = mean_scores(emb.phi, n_queries, g)
        closed = _closed(emb.phi)
        D = hop_distance(A)
        phi_rand = (torch.rand(nodes, dim, dtype=torch.float64, generator=g) * 2 - 1) * np.pi / 4
        S_rand = mean_scores(phi_rand, n_queries, g)
        norm, gen, dep = emb.e.norm(dim=-1).numpy(), generality(A).numpy(), depth(A)
        off = ~np.eye(nodes, dtype=bool)
        row = {
            "kind": kind,
            "rho_score_distance": spearman(S[iu], D[iu]),
            "rho_closed_form_distance": spearman(closed[iu], D[iu]),
            "mc_vs_closed_max_err": float(np.abs(S - closed).max()),
            "rho_random_angles": spearman(S_rand[iu], D[iu]),
            "rel_score_drop": float(1 - S[iu].min() / (2 * dim)),  # lowest pair score below the maximum 2n
            "distance": D[iu],
            "score": S[iu],
            "rho_norm_depth": spearman(norm, dep),
            "rho_norm_generality": spearman(norm, gen),
            "rho_meanscore_generality": spearman((S * off).sum(1) / (nodes - 1), gen),
            "norm": norm,
            "depth": dep,
            "generality": gen,
        }
        if i < n_perm:
            row.update(_permutation(A, emb, dim, seed + i, g))
        res["graphs"].append(row)
    res["summary"] = _summary(res["graphs"])
    return res


def _permutation(A, emb, dim: int, seed: int, g: torch.Generator) -> dict:
    M = A.shape[0]
    perm = torch.randperm(M, generator=g)
    Ap = A[perm][:, perm]
    init = initial_points(M, dim, seed)  # the start ``emb`` was fitted from
    exact = embed(Ap, dim=dim, init=init[perm])  # the same start, reordered: must give p[perm]
    layer = CapeAttention(d_model=8, n_heads=2, d_head=2 * dim, seed=seed).double()
    x = torch.randn(1, M, 8, dtype=torch.float64, generator=g)
    with torch.no_grad():
        _, cache = layer.run_with_cache(x, emb.phi, names_filter="hook_pattern")
        _, cache_p = layer.run_with_cache(x[:, perm], exact.phi, names_filter="hook_pattern")
    pat, pat_p = cache["hook_pattern"][0], cache_p["hook_pattern"][0]
    fresh = embed(Ap, dim=dim, seed=seed + 10_000)  # a fresh start in the new order
    reseed = embed(A, dim=dim, seed=seed + 20_000)  # baseline: same order, another seed
    S = _closed(emb.phi)
    iu = np.triu_indices(M, 1)
    inv = torch.argsort(perm)
    S_fresh = _closed(fresh.phi)[inv][:, inv]  # back to the original order
    return {
        "perm_exact_max_err_p": float((exact.p - emb.p[perm]).abs().max()),
        "perm_exact_max_err_pattern": float((pat_p - pat[:, perm][:, :, perm]).abs().max()),
        "rho_scores_permuted_fresh": spearman(S[iu], S_fresh[iu]),
        "rho_scores_reseeded": spearman(S[iu], _closed(reseed.phi)[iu]),
        "rho_fresh_score_distance": spearman(S_fresh[iu], hop_distance(A)[iu]),
        "scores_pair": [S[iu], S_fresh[iu]],
    }


def _closed(phi: torch.Tensor) -> np.ndarray:
    return 2 * torch.cos(phi[None] - phi[:, None]).sum(-1).numpy()


def _summary(rows: list[dict]) -> dict:
    out = {}
    keys = [k for k in rows[0] if k.startswith(("rho_", "perm_", "mc_", "rel_"))]
    for kind in ("tree", "dag", "all"):
        sel = [r for r in rows if kind in ("all", r["kind"])]
        out[kind] = {}
        for k in keys:
            v = np.array([r[k] for r in sel if k in r], float)
            v = v[~np.isnan(v)]
            if len(v):
                out[kind][k] = {
                    "mean": float(v.mean()),
                    "std": float(v.std()),
                    "min": float(v.min()),
                    "max": float(v.max()),
                    "n": len(v),
                }
    return out


def _histograms(ax, rows: list[dict], specs, bins) -> None:
    """One histogram per (key, label, colour) of the per-graph values ``row[key]`` (nan left out)."""
    for key, label, color in specs:
        ax.hist([r[key] for r in rows if not np.isnan(r[key])], bins=bins, alpha=0.6, color=color, label=label)
    ax.set_ylabel("graphs")
    ax.legend(fontsize=8)


def _plot_distance(res: dict):
    import matplotlib.pyplot as plt  # plotting stays off the import path of the CLI's --help

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for kind, color in (("tree", "C0"), ("dag", "C1")):
        rows = [r for r in res["graphs"] if r["kind"] == kind]
        d = np.concatenate([r["distance"] for r in rows])
        s = np.concatenate([r["score"] for r in rows])
        ds = np.unique(d[np.isfinite(d)])
        means = [s[d == v].mean() for v in ds]
        sds = [s[d == v].std() for v in ds]
        axes[0].errorbar(ds, means, yerr=sds, fmt="o-", color=color, capsize=3, label=f"random {kind}s ({len(rows)})")
    axes[0].axhline(2 * res["dim"], color="grey", ls=":", label="maximum (phi_m = phi_n)")
    axes[0].set_xlabel("causal hop distance in the skeleton")
    axes[0].set_ylabel("E_q q^T R(phi_n - phi_m) q  (mean ± sd over pairs)")
    axes[0].set_title("(a) score against causal distance")
    axes[0].legend(fontsize=8)
    specs = [("rho_score_distance", "CAPE angles", "C0"), ("rho_random_angles", "random angles (control)", "grey")]
    _histograms(axes[1], res["graphs"], specs, np.linspace(-1, 1, 41))
    axes[1].set_xlabel("Spearman(score, hop distance) per graph")
    axes[1].set_title("(b) per-graph rank correlation")
    fig.suptitle(
        f"CAPE: attention decays with causal distance? {res['n_graphs']} graphs, M={res['nodes']}, n={res['dim']}, {res['n_queries']} random q"
    )
    fig.tight_layout()
    return fig


def _plot_generality(res: dict):
    import matplotlib.pyplot as plt  # plotting stays off the import path of the CLI's --help

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    rng = np.random.default_rng(0)
    for kind, color in (("tree", "C0"), ("dag", "C1")):
        rows = [r for r in res["graphs"] if r["kind"] == kind]
        dep = np.concatenate([r["depth"] for r in rows])
        norm = np.concatenate([r["norm"] for r in rows])
        gen = np.concatenate([r["generality"] * res["nodes"] for r in rows])
        axes[0].scatter(dep + rng.uniform(-0.15, 0.15, len(dep)), norm, s=5, alpha=0.4, color=color, label=f"{kind}s")
        axes[1].scatter(gen, norm, s=5, alpha=0.4, color=color, label=f"{kind}s")
    axes[0].set_xlabel("depth (longest path from a root)")
    axes[1].set_xlabel("generality M * pi_v (reversed PageRank)")
    axes[1].set_xscale("log")
    axes[1].xaxis.set_minor_formatter(plt.NullFormatter())
    for ax in axes[:2]:
        ax.set_ylabel("|e_v| (Poincare norm)")
        ax.legend(fontsize=8)
    axes[0].set_title("(a) norm against causal specificity")
    axes[1].set_title("(b) norm against causal generality")
    specs = [
        ("rho_norm_depth", "Spearman(|e|, depth)", "C2"),
        ("rho_norm_generality", "Spearman(|e|, generality)", "C3"),
        ("rho_meanscore_generality", "Spearman(mean score, generality)", "C4"),
    ]
    _histograms(axes[2], res["graphs"], specs, np.linspace(-1, 1, 41))
    axes[2].set_xlabel("per-graph Spearman")
    axes[2].set_title("(c) per-graph rank correlations")
    fig.suptitle(f"CAPE: roots near the origin, leaves far? {res['n_graphs']} graphs, M={res['nodes']}, n={res['dim']}")
    fig.tight_layout()
    return fig


def _plot_permutation(res: dict):
    import matplotlib.pyplot as plt  # plotting stays off the import path of the CLI's --help

    rows = [r for r in res["graphs"] if "perm_exact_max_err_p" in r]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    a, b = np.concatenate([r["scores_pair"][0] for r in rows]), np.concatenate([r["scores_pair"][1] for r in rows])
    axes[0].scatter(a, b, s=4, alpha=0.4)
    lim = [min(a.min(), b.min()), max(a.max(), b.max())]
    axes[0].plot(lim, lim, "k:", lw=1)
    axes[0].set_xlabel("score S[m, n], original order")
    axes[0].set_ylabel("score after permuting, fresh init (mapped back)")
    err = max(max(r["perm_exact_max_err_p"], r["perm_exact_max_err_pattern"]) for r in rows)
    axes[0].set_title(f"(a) fresh init; permuted init is exact (max err {err:.1e})")
    lo = min(min(r["rho_scores_permuted_fresh"], r["rho_scores_reseeded"]) for r in rows)
    bins = np.linspace(min(lo, 0.8) - 0.01, 1, 31)
    specs = [
        ("rho_scores_permuted_fresh", "permuted, fresh init", "C0"),
        ("rho_scores_reseeded", "same order, another seed", "C1"),
    ]
    _histograms(axes[1], rows, specs, bins)
    axes[1].set_xlabel("Spearman between score matrices")
    axes[1].set_title("(b) order dependence = seed dependence")
    fig.suptitle(f"CAPE: robust to permuting the feature order? {len(rows)} graphs, M={res['nodes']}, n={res['dim']}")
    fig.tight_layout()
    return fig


def compute(subject, config: Config) -> dict:
    """``measure`` with the config's n_contexts (graphs), nodes, dim, n_queries and n_perm."""
    M, n = config.nodes, config.dim  # float64: each graph's A, distances and embedding; q and R(phi) q per query
    check_memory(8 * (config.n_queries * M * (4 * n + M) + M * M * (n + 4)), f"--nodes {M} --dim {n} --n-queries {config.n_queries}")
    n_perm = min(config.n_perm, config.n_contexts)
    return measure(config.n_contexts, config.nodes, config.dim, config.n_queries, n_perm, config.seed, progress=True)


def figures(result: common.Result) -> dict:
    res = result.data
    return {
        "cape_distance": _plot_distance(res),
        "cape_generality": _plot_generality(res),
        "cape_permutation": _plot_permutation(res),
    }


def summary(res: dict) -> str:
    lines = [f"{NAME}: {res['n_graphs']} random graphs (trees and DAGs), M={res['nodes']}, n={res['dim']}"]
    for kind, s in res["summary"].items():
        lines.append(f"  {kind}:")
        for k, v in s.items():
            lines.append(
                f"    {k:30s} mean {v['mean']:+.3g}  sd {v['std']:.3g}  [{v['min']:+.3g}, {v['max']:+.3g}]  n={v['n']}"
            )
    return "\n".join(lines)




ANALYSIS = common.register(globals())
