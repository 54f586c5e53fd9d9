"""CAPE downstream: masked-feature prediction on the continuous system, with positional schemes built
from CAPE steps 1-3 and the paper's ablations; the model, its trainer and the closed-form Bayes reference
(``analyses.cape_downstream`` runs and plots it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from cape.attention import rotate
from cape.embedding import contrastive_loss, embed, generality, hop_distance, hop_weights, random_tree
from cape.structure import (
    StructureConfig,
    continuous_data,
    learn_structure,
    structure_metrics,
    tree_adjacency,
)
from probes.continuous import ContinuousTask

# The default run: the baselines, CAPE alone, and the paper's ablation table in the paper's setting (the
# feature-identity token kept, as scGPT keeps its gene tokens, and CAPE as the positional encoding on top).
VARIANTS = (
    "none",
    "slot",
    "identity",
    "cape",
    "identity_cape",
    "identity_cape_oracle",
    "identity_cape_random",
    "identity_cape_euclidean",
    "identity_cape_additive",
)
# The same ablations without the identity token (``--variants all``): the masked token then cannot tell
# which feature it is, and no scheme comes near the floor.
EXTRA_VARIANTS = ("cape_oracle", "cape_random", "cape_euclidean", "cape_additive")
ALL_VARIANTS = VARIANTS + EXTRA_VARIANTS
ROTARY = ("cape", "cape_oracle", "cape_random", "cape_euclidean")  # the phi each rotary variant uses
LABELS = {
    "none": "none",
    "slot": "slot PE (BERT)",
    "identity": "identity emb.",
    "cape": "CAPE",
    "cape_oracle": "CAPE, true tree",
    "cape_random": "w/o CSL (random DAG)",
    "cape_euclidean": "w/o hyperbolic",
    "cape_additive": "w/o rotary (additive)",
}
LABELS.update({f"identity_{k}": f"identity + {v}" for k, v in LABELS.items() if k.startswith("cape")})


def variant_parts(variant: str) -> tuple[bool, str | None]:
    """``(identity embedding?, CAPE part)``: the CAPE part is a key of ROTARY, 'cape_additive' or None."""
    if variant not in ALL_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(ALL_VARIANTS)}")
    base = variant.removeprefix("identity_") if variant.startswith("identity_") else variant
    return variant.startswith("identity"), base if base.startswith("cape") else None


@dataclass
class DownstreamConfig:
    """Data, model and training sizes; the defaults are the analysis's default run."""

    M: int = 12  # features (= H positions of the continuous task)
    d: int = 2  # vector dimension of a feature
    rho: float = 0.8
    n_train: int = 2000
    n_test: int = 2000
    d_model: int = 32
    n_heads: int = 4
    d_head: int = 8  # rotary angles per feature: d_head / 2 (= the hyperbolic dimension n)
    n_layers: int = 2
    d_mlp: int = 64
    steps: int = 300
    batch: int = 64
    lr: float = 1e-2
    eval_every: int = 50
    embed_steps: int = 300  # CAPE step 2 (Riemannian SGD) iterations

    def check(self) -> None:
        if self.M < 3 or self.d < 1 or not 0 < self.rho < 1:
            raise ValueError(f"need M >= 3, d >= 1 and 0 < rho < 1, got M={self.M}, d={self.d}, rho={self.rho}")
        if self.n_train < 2 or self.n_test < 1 or self.steps < 1 or self.batch < 1 or self.eval_every < 1:
            raise ValueError("need n_train >= 2, n_test >= 1, steps >= 1, batch >= 1 and eval_every >= 1")
        if (
            self.d_head % 2
            or min(self.d_model, self.n_heads, self.d_head, self.n_layers, self.d_mlp) < 1
            or self.lr <= 0
        ):
            raise ValueError("need an even d_head, positive d_model/n_heads/n_layers and lr > 0")


# ----------------------------------------------------------------------------- the Bayes reference


def tree_covariance(parents: Int[Tensor, " M"], rho: float, A: Float[Tensor, "d d"]) -> Float[Tensor, "Md Md"]:
    """Joint covariance of the stacked vectors ``(x_0, ..., x_{M-1})`` [M d, M d] of the continuous system on
    the tree ``parents`` (pa(h) < h, root -1): ``Cov(x_h, x_k) = rho A^T Cov(x_pa(h), x_k)`` for k < h, I on
    the diagonal blocks; in closed form ``rho^(a+b) (A^T)^a A^b`` with a, b the hops from i, j to their
    lowest common ancestor."""
    parents = torch.as_tensor(parents).long()
    A = torch.as_tensor(A, dtype=torch.float64)
    M, d = parents.numel(), A.shape[0]
    if parents[0] != -1 or any(not 0 <= p < h for h, p in enumerate(parents.tolist()) if h):
        raise ValueError(f"parents must have parents[0] = -1 and 0 <= parents[h] < h, got {parents.tolist()}")
    S = torch.zeros(M, M, d, d, dtype=torch.float64)
    for h in range(M):
        S[h, h] = torch.eye(d, dtype=torch.float64)
        for k in range(h):
            S[h, k] = rho * A.T @ S[parents[h], k]
            S[k, h] = S[h, k].T
    return S.permute(0, 2, 1, 3).reshape(M * d, M * d)


def conditional_mean_weights(Sigma: Float[Tensor, "Md Md"], v: int, d: int) -> Float[Tensor, "d Md"]:
    """``E[x_v | x_{-v}] = W x`` (W is zero on v's own block): ``W_{v,-v} = Sigma_{v,-v} Sigma_{-v,-v}^{-1}``."""
    idx = torch.arange(Sigma.shape[0])
    own = (idx // d) == v
    W = torch.zeros(d, Sigma.shape[0], dtype=torch.float64)
    W[:, ~own] = torch.linalg.solve(Sigma[~own][:, ~own], Sigma[~own][:, own]).T
    return W


def conditional_mse(Sigma: Float[Tensor, "Md Md"], d: int) -> Float[Tensor, " M"]:
    """Bayes MSE per coordinate of each feature given all the others: ``tr Cov(x_v | x_{-v}) / d``."""
    M = Sigma.shape[0] // d
    out = torch.empty(M, dtype=torch.float64)
    idx = torch.arange(Sigma.shape[0])
    for v in range(M):
        own = (idx // d) == v
        W = conditional_mean_weights(Sigma, v, d)
        out[v] = (Sigma[own][:, own] - W[:, ~own] @ Sigma[~own][:, own]).trace() / d
    return out


def bayes_predict(Sigma: Float[Tensor, "Md Md"], x: Float[Tensor, "B M d"], masked: Int[Tensor, " B"]) -> Tensor:
    """The Gaussian conditional mean of ``x[b, masked[b]]`` given the other features: [B, d]."""
    B, M, d = x.shape
    W = torch.stack([conditional_mean_weights(Sigma, v, d) for v in range(M)])  # [M, d, Md]
    return torch.einsum("bij,bj->bi", W[masked], x.reshape(B, M * d).double())


# ----------------------------------------------------------------------------- data, masks and slot orders


def fixed_tree_data(M: int, d: int, rho: float, n: int, seed: int, data_seed: int):
    """``(task, parents, X [n, M, d])``: A and the tree from ``seed``, n i.i.d. samples from ``data_seed``."""
    task = ContinuousTask.random(d, 1, M, rho=rho, seed=seed)
    parents = task.sample_parents(1, torch.Generator().manual_seed(seed))[0]
    return task, parents, continuous_data(task, parents, n, data_seed)


def sample_views(n: int, M: int, generator: torch.Generator) -> tuple[Int[Tensor, "n M"], Int[Tensor, " n"]]:
    """A uniform slot order per sample (``feat[b, s]`` = the feature shown in slot s) and a uniform masked
    SLOT per sample; the masked feature is ``feat[b, slot]``, uniform and independent of the slot."""
    feat = torch.rand(n, M, generator=generator).argsort(-1)
    slot = torch.randint(M, (n,), generator=generator)
    return feat, slot


# ----------------------------------------------------------------------------- the Euclidean step 2


def embed_euclidean(
    A, dim: int = 4, k: int = 2, lambda_g: float = 1.0, steps: int = 300, lr: float = 0.1, seed: int = 0
) -> Float[Tensor, "M dim"]:
    """CAPE's step-2 loss in R^dim (``_euclidean_loss``: squared Euclidean distances, regulariser
    ``pi_v |x_v|^2``), the same hop weights and PageRank; full-batch gradient descent from ``1e-2 N(0, I)``,
    each step capped at length 1 as ``embed`` caps its geodesic steps. Returns the points [M, dim]."""
    A = torch.as_tensor(A, dtype=torch.float64)
    W, pi = hop_weights(A, k), generality(A)
    x = 1e-2 * torch.randn(A.shape[0], dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    for _ in range(steps):
        x.requires_grad_(True)
        loss = _euclidean_loss(x, W, pi, lambda_g)
        (g,) = torch.autograd.grad(loss, x)
        with torch.no_grad():
            step = lr * g
            x = x - step / step.norm(dim=-1, keepdim=True).clamp_min(1.0)  # cap a step at length 1, as embed
    return x.detach()


def _euclidean_loss(x, W, pi, lambda_g):
    """``cape.embedding.cape_loss`` with ``sq_lorentz`` -> ``|x - y|^2`` and ``d_L^2(p, o)`` -> ``|x|^2``."""
    D = (x.unsqueeze(1) - x.unsqueeze(0)).pow(2).sum(-1)
    return contrastive_loss(D, W, pi, x.pow(2).sum(-1), lambda_g)


def random_dag_like(A: Float[Tensor, "M M"], generator: torch.Generator) -> Float[Tensor, "M M"]:
    """A random DAG with as many edges as ``A`` (a random recursive tree on a random node order, then
    random extra forward edges or random deletions), carrying ``A``'s edge weights in random order."""
    M = A.shape[0]
    weights = A[A != 0]
    n_edges = weights.numel()
    order = torch.randperm(M, generator=generator)
    tree = random_tree(M, generator) != 0  # in topological order 0..M-1
    edges = tree.nonzero().tolist()
    if n_edges < len(edges):
        keep = torch.randperm(len(edges), generator=generator)[:n_edges].tolist()
        edges = [edges[i] for i in keep]
    else:
        free = (torch.ones(M, M, dtype=torch.bool).triu(1) & ~tree).nonzero().tolist()
        pick = torch.randperm(len(free), generator=generator)[: n_edges - len(edges)].tolist()
        edges += [free[i] for i in pick]
    out = torch.zeros(M, M, dtype=torch.float64)
    shuffled = weights[torch.randperm(n_edges, generator=generator)]
    for (i, j), w in zip(edges, shuffled.tolist()):
        out[order[i], order[j]] = w
    return out


# ----------------------------------------------------------------------------- the model


class MaskedFeatureModel(HookedRootModule):
    """Pre-LN transformer over M feature tokens in slot order. ``forward(x [B,M,d], feat [B,M], slot [B])``
    returns the prediction [B,d] of the vector at the masked slot. ``variant`` picks the positional scheme;
    ``phi`` [M, d_head/2] (rotary variants) and ``coords`` [M, n] (``cape_additive``) are fixed buffers.
    Hook: ``blocks.{l}.attn.hook_pattern`` [B, heads, M, M] (query slot, key slot)."""

    def __init__(self, cfg: DownstreamConfig, variant: str, phi: Tensor | None = None, coords: Tensor | None = None):
        super().__init__()
        self.identity, part = variant_parts(variant)
        if (part in ROTARY) != (phi is not None) or (part == "cape_additive") != (coords is not None):
            raise ValueError(f"variant {variant!r}: pass phi exactly for the rotary variants, coords for the additive")
        if phi is not None and tuple(phi.shape) != (cfg.M, cfg.d_head // 2):
            raise ValueError(f"phi must have shape ({cfg.M}, {cfg.d_head // 2}), got {tuple(phi.shape)}")
        D, hd = cfg.d_model, cfg.n_heads * cfg.d_head
        self.cfg, self.variant = cfg, variant
        self.embed = nn.Linear(cfg.d, D)
        self.mask = nn.Parameter(0.02 * torch.randn(D))
        self.ln1 = nn.ModuleList(nn.LayerNorm(D) for _ in range(cfg.n_layers))
        self.qkv = nn.ModuleList(nn.Linear(D, 3 * hd) for _ in range(cfg.n_layers))
        self.out = nn.ModuleList(nn.Linear(hd, D) for _ in range(cfg.n_layers))
        self.ln2 = nn.ModuleList(nn.LayerNorm(D) for _ in range(cfg.n_layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.Linear(D, cfg.d_mlp), nn.GELU(), nn.Linear(cfg.d_mlp, D)) for _ in range(cfg.n_layers)
        )
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, cfg.d)
        # Variant-specific weights are created after the shared ones, so the shared init is the same for all.
        if variant == "slot":
            self.pos = nn.Parameter(0.02 * torch.randn(cfg.M, D))
        if self.identity:
            self.ident = nn.Parameter(0.02 * torch.randn(cfg.M, D))
        if part == "cape_additive":
            self.coord_map = nn.Linear(coords.shape[1], D)
            self.register_buffer("coords", torch.as_tensor(coords, dtype=torch.float64).clone())
        self.register_buffer("phi", None if phi is None else torch.as_tensor(phi, dtype=torch.float64).clone())
        self.blocks = nn.ModuleList(nn.Module() for _ in range(cfg.n_layers))  # hook names as TransformerLens's
        for block in self.blocks:
            block.attn = nn.Module()
            block.attn.hook_pattern = HookPoint()
        self.setup()

    def forward(self, x: Float[Tensor, "B M d"], feat: Int[Tensor, "B M"], slot: Int[Tensor, " B"]) -> Tensor:
        B, M, _ = x.shape
        cfg = self.cfg
        h = self.embed(x.to(self.head.weight.dtype))
        is_mask = torch.arange(M, device=x.device) == slot[:, None]  # [B, M]
        h = torch.where(is_mask[..., None], self.mask.expand_as(h), h)
        if self.variant == "slot":
            h = h + self.pos
        if self.identity:
            h = h + self.ident[feat]
        if hasattr(self, "coords"):
            h = h + self.coord_map(self.coords.to(h.dtype)[feat])
        phi = None if self.phi is None else self.phi.to(h.dtype)[feat][:, :, None, None]  # [B, M, 1, 1, n]
        for layer in range(cfg.n_layers):
            qkv = self.qkv[layer](self.ln1[layer](h)).view(B, M, 3, cfg.n_heads, cfg.d_head)
            qk, v = qkv[:, :, :2], qkv[:, :, 2]
            if phi is not None:  # score q_m^T R(phi_n - phi_m) k_n, as cape.attention.rotary_scores
                qk = rotate(qk, phi)
            q, k = qk.permute(2, 0, 3, 1, 4)  # [B, heads, M, d_head] each
            scores = q @ k.transpose(-1, -2) / math.sqrt(cfg.d_head)
            pattern = self.blocks[layer].attn.hook_pattern(scores.softmax(-1))
            z = (pattern @ v.transpose(1, 2)).transpose(1, 2).reshape(B, M, -1)
            h = h + self.out[layer](z)
            h = h + self.mlp[layer](self.ln2[layer](h))
        return self.head(self.ln_f(h[torch.arange(B), slot]))


def gather_view(X: Float[Tensor, "n M d"], feat: Int[Tensor, "n M"]) -> Float[Tensor, "n M d"]:
    """The samples in slot order: ``out[b, s] = X[b, feat[b, s]]``."""
    return X.gather(1, feat[..., None].expand(-1, -1, X.shape[-1]))


def train_variant(
    cfg: DownstreamConfig, variant: str, Xtr, test, model_seed: int, phi=None, coords=None
) -> tuple[nn.Module, list]:
    """Adam with cosine decay on fresh masks and slot orders of the N_train samples (stream seeded by
    ``model_seed``, shared by all variants); returns the model and the test-MSE curve [(step, mse)]."""
    torch.manual_seed(model_seed)  # nn init
    model = MaskedFeatureModel(cfg, variant, phi, coords)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, foreach=True)  # bit for bit the per-tensor loop (test_optim)
    g = torch.Generator().manual_seed(10_000 + model_seed)
    X = Xtr.float()
    curve = []
    for step in range(1, cfg.steps + 1):
        for group in opt.param_groups:
            group["lr"] = cfg.lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / cfg.steps))
        idx = torch.randint(X.shape[0], (cfg.batch,), generator=g)
        feat, slot = sample_views(cfg.batch, cfg.M, g)
        xv = gather_view(X[idx], feat)
        target = xv[torch.arange(cfg.batch), slot]
        loss = (model(xv, feat, slot) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            curve.append((step, evaluate(model, *test)))
    return model, curve


def markov_blanket(parents: Int[Tensor, " M"]) -> Float[Tensor, "M M"]:
    """``[v, u] = 1`` when u is v's parent or child: the features the Bayes predictor of x_v uses (on a
    Gaussian tree, E[x_v | x_-v] depends on these only)."""
    adj = tree_adjacency(parents)
    return (adj | adj.T).double()


@torch.no_grad()
def blanket_attention(model, xv, feat, slot, parents) -> list[float]:
    """Per layer, the attention mass the masked slot's query puts on the slots holding its feature's Markov
    blanket, averaged over heads and samples (``blocks.{l}.attn.hook_pattern``)."""
    B = xv.shape[0]
    _, cache = model.run_with_cache(xv, feat, slot, names_filter=lambda n: n.endswith("hook_pattern"))
    masked = feat[torch.arange(B), slot]
    on_blanket = markov_blanket(parents)[masked[:, None], feat]  # [B, key slot]
    out = []
    for layer in range(model.cfg.n_layers):
        rows = cache[f"blocks.{layer}.attn.hook_pattern"][torch.arange(B), :, slot]  # [B, heads, key slot]
        out.append((rows.double() * on_blanket[:, None]).sum(-1).mean().item())
    return out


@torch.no_grad()
def evaluate(model, xv, feat, slot) -> float:
    """Test MSE per coordinate of the masked feature."""
    target = xv[torch.arange(xv.shape[0]), slot]
    return (model(xv, feat, slot) - target).pow(2).mean().item()


# ----------------------------------------------------------------------------- the experiment


def positional_inputs(cfg: DownstreamConfig, Xtr, parents, seed: int, structure: StructureConfig | None = None):
    """Steps 1-3 and the ablations' graphs: ``(phi per variant, coords for cape_additive, info dict)``."""
    n = cfg.d_head // 2
    learned = learn_structure(Xtr, structure or StructureConfig(seed=seed))
    A_learned = learned["A"]
    A_true = tree_adjacency(parents).double() * cfg.rho * math.sqrt(cfg.d)  # ||rho A^T||_F, as step 1 estimates
    A_random = random_dag_like(A_learned, torch.Generator().manual_seed(seed + 7))
    emb = embed(A_learned, dim=n, steps=cfg.embed_steps, seed=seed)
    emb_true = embed(A_true, dim=n, steps=cfg.embed_steps, seed=seed)
    emb_random = embed(A_random, dim=n, steps=cfg.embed_steps, seed=seed)
    x_euc = embed_euclidean(A_learned, dim=n, steps=cfg.embed_steps, seed=seed)
    scale = emb.e.norm(dim=-1).max() / x_euc.norm(dim=-1).max().clamp_min(1e-12)
    phi = {
        "cape": emb.phi,
        "cape_oracle": emb_true.phi,
        "cape_random": emb_random.phi,
        "cape_euclidean": (math.pi / 4) * scale * x_euc,
    }
    info = {
        "structure": structure_metrics(A_learned, parents),
        "structure_random": structure_metrics(A_random, parents),
        "A_learned": A_learned,
        "A_random": A_random,
        "embedding_loss": {"learned": emb.losses[-1], "true": emb_true.losses[-1], "random": emb_random.losses[-1]},
        "angles": {k: angle_geometry(v, parents) for k, v in phi.items()},
    }
    return phi, emb.e, info


def angle_geometry(phi: Float[Tensor, "M n"], parents: Int[Tensor, " M"]) -> dict:
    """Largest |angle|, smallest and mean distance between two features' angle vectors, and the Pearson
    correlation of that distance with the hop distance in the TRUE tree (how much of G the angles carry)."""
    M = phi.shape[0]
    iu = torch.triu_indices(M, M, 1)
    dist = torch.cdist(phi.double(), phi.double())[iu[0], iu[1]]
    hops = torch.as_tensor(hop_distance(tree_adjacency(parents).double()))[iu[0], iu[1]]
    return {
        "max_abs": phi.abs().max().item(),
        "min_pair_distance": dist.min().item(),
        "mean_pair_distance": dist.mean().item(),
        "corr_true_hops": torch.corrcoef(torch.stack([dist, hops]))[0, 1].item(),
    }
