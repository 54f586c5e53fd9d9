"""The in-context causal-tree task of Wei et al. (ICLR 2026), docs/paper.md section 1.

Token layout (fixed, used everywhere in the suite): a context is L+1 sequences of H tokens laid out
example-major, flat index ``l * H + h`` (0-based). Examples ``l = 0 .. L-1`` are the demonstrations,
``l = L`` is the target sequence. All L+1 sequences share one causal tree ``parents`` with
``parents[0] = -1`` and ``parents[h] ~ Unif{0, ..., h-1}``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

ROW_SUM_TOL = 1e-6
MAX_SEED = 2**63 - 1  # torch generators take 64-bit seeds; training adds offsets to its seed
# Stated bounds on task sizes (checked before anything is allocated): pi is d x d float64, a context
# holds (L+1) H tokens. The memory a model or a batch of these would need is checked where it is built.
MAX_D_VOCAB = 4096
MAX_N_EXAMPLES = 65536
MAX_SEQ_LEN = 65536
MAX_N_TOKENS = 2**20


def check_int(value, name: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int if it is an integer (not a bool, not 10.9) in ``[low, high]``; else one
    ``ValueError`` naming ``name``, the value and the bound. Every integer field and flag goes through it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be {_bounds(low, high, False, False)}, got {value}")
    return value


def check_float(
    value, name: str, low: float | None = None, high: float | None = None, *, open_low=False, open_high=False
) -> float:
    """``value`` as a float if it is a finite real number in the bounds (``open_*``: strict); else one
    ``ValueError`` naming ``name``, the value and the bound. Every float field and flag goes through it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    bad = not math.isfinite(value)
    bad |= low is not None and (value <= low if open_low else value < low)
    bad |= high is not None and (value >= high if open_high else value > high)
    if bad:
        raise ValueError(f"{name} must be a finite number {_bounds(low, high, open_low, open_high)}, got {value!r}")
    return value


def _bounds(low, high, open_low: bool, open_high: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"
    if low is not None:
        return f"{'>' if open_low else '>='} {low}"
    if high is not None:
        return f"{'<' if open_high else '<='} {high}"
    return "(any)"


def check_sizes(d_vocab, n_examples, seq_len, where: str = "task", min_examples: int = 1) -> tuple[int, int, int]:
    """d, L, H as ints within the stated bounds (``MAX_*``), the context length (L+1) H included. Our task
    needs a demonstration; the family's (``probes.graph_task``) may have none (``min_examples=0``)."""
    d = check_int(d_vocab, f"{where} d_vocab".strip(), 2, MAX_D_VOCAB)
    L = check_int(n_examples, f"{where} n_examples".strip(), min_examples, MAX_N_EXAMPLES)
    H = check_int(seq_len, f"{where} seq_len".strip(), 2, MAX_SEQ_LEN)
    if (L + 1) * H > MAX_N_TOKENS:
        raise ValueError(
            f"{where} contexts of (L+1)H = {(L + 1) * H} tokens exceed the bound of {MAX_N_TOKENS}".strip()
        )
    return d, L, H


def check_kernel(pi: Tensor, name: str = "pi") -> Tensor:
    """Validate a row-stochastic kernel ``pi[a, b] = pi(b | a)``; return it as float64."""
    pi = torch.as_tensor(pi, dtype=torch.float64)
    if pi.ndim != 2 or pi.shape[0] != pi.shape[1]:
        raise ValueError(f"{name} must be a square d x d matrix, got shape {tuple(pi.shape)}")
    if not torch.isfinite(pi).all():
        raise ValueError(f"{name} has NaN or Inf entries; expected finite probabilities")
    if (pi < 0).any():
        raise ValueError(f"{name} has negative entries (min {pi.min().item():.3g}); expected >= 0")
    worst = (pi.sum(-1) - 1).abs().max().item()
    if worst > ROW_SUM_TOL:
        raise ValueError(f"{name} is not row-stochastic: a row sums to 1 {worst:+.3g}; expected rows summing to 1")
    return pi


def check_distribution(p: Tensor, d: int, name: str = "root") -> Tensor:
    """Validate a probability vector of length d; return it as float64."""
    p = torch.as_tensor(p, dtype=torch.float64)
    if p.shape != (d,):
        raise ValueError(f"{name} must have shape ({d},), got {tuple(p.shape)}")
    if not torch.isfinite(p).all() or (p < 0).any() or abs(p.sum().item() - 1) > ROW_SUM_TOL:
        raise ValueError(f"{name} must be a probability vector (finite, >= 0, sums to 1)")
    return p


def dirichlet_kernel(
    d_vocab: int, alpha: float = 1.0, gamma: float = 0.2, generator: torch.Generator | None = None
) -> Float[Tensor, "d d"]:
    """Rows ``(1 - gamma) * Dirichlet(alpha) + gamma / d``: a kernel minorised by gamma / d (Lemma 3).

    Args:
        d_vocab: d, the number of tokens (2 to 4096).
        alpha: the Dirichlet concentration (> 0; small is sharp).
        gamma: the uniform floor's weight, in [0, 1].
        generator: the random source (default: torch's global one).

    Returns:
        The kernel ``pi`` ``[d, d]`` (float64), ``pi[a, b] = pi(b | a)``, rows summing to 1.
    """
    d_vocab = check_int(d_vocab, "d_vocab", 2, MAX_D_VOCAB)
    return dirichlet_rows(d_vocab, d_vocab, alpha, gamma, generator)


def dirichlet_rows(
    n_rows: int, d_vocab: int, alpha: float = 1.0, gamma: float = 0.2, generator: torch.Generator | None = None
) -> Float[Tensor, "rows d"]:
    """``n_rows`` rows ``(1 - gamma) * Dirichlet(alpha) + gamma / d`` (``dirichlet_kernel``: d rows)."""
    gamma = check_float(gamma, "gamma", 0, 1)
    alpha = check_float(alpha, "alpha", 0, open_low=True)
    # Dirichlet via normalised Gamma draws; torch's Dirichlet sampler takes no generator, so we draw
    # the Gammas ourselves to keep the kernel a function of the seed.
    g = generator if generator is not None else torch.default_generator
    gammas = _gamma_sample(n_rows * d_vocab, alpha, g).reshape(n_rows, d_vocab)
    rows = gammas / gammas.sum(-1, keepdim=True)
    if not torch.isfinite(rows).all():  # tiny alpha: every Gamma draw of a row underflows to 0
        raise ValueError(f"alpha={alpha!r} is too small: the Dirichlet draws underflow to zero; expected alpha >= 0.01")
    return (1 - gamma) * rows + gamma / d_vocab


MAX_REJECTION_ROUNDS = 64


def _gamma_sample(n_draws: int, alpha: float, generator: torch.Generator) -> Float[Tensor, " n"]:
    """``n_draws`` Gamma(alpha, 1) draws from a seeded generator (Marsaglia-Tsang, with the alpha < 1 boost)."""
    boost = alpha < 1
    a = alpha + 1 if boost else alpha
    c_d = a - 1 / 3
    c = 1 / (9 * c_d) ** 0.5
    out = torch.empty(n_draws, dtype=torch.float64)
    filled = 0
    for _ in range(MAX_REJECTION_ROUNDS):  # each round accepts > 95% of its (4x oversized) proposals
        if filled == n_draws:
            break
        n = 4 * (n_draws - filled) + 16
        x = torch.randn(n, dtype=torch.float64, generator=generator)
        u = torch.rand(n, dtype=torch.float64, generator=generator)
        v = (1 + c * x) ** 3
        ok = (v > 0) & (torch.log(u) < 0.5 * x**2 + c_d - c_d * v + c_d * torch.log(v.clamp_min(1e-300)))
        acc = (c_d * v)[ok][: n_draws - filled]
        out[filled : filled + acc.numel()] = acc
        filled += acc.numel()
    if filled < n_draws:
        raise ValueError(f"the Gamma({alpha!r}) sampler accepted too few draws; expected a moderate alpha")
    if boost:
        out = out * torch.rand(n_draws, dtype=torch.float64, generator=generator) ** (1 / alpha)
    return out


def parent_values(x: Tensor, parents: Int[Tensor, "batch H"], h: int) -> Tensor:
    """``x[b, l, parents[b, h]]`` for every context b and example l, from ``x`` [batch, L+1, H, ...]: the
    values at position h's parent, the step of ancestral sampling along the tree."""
    index = parents[:, h].view(-1, 1, 1, *[1] * (x.ndim - 3)).expand(*x.shape[:2], 1, *x.shape[3:])
    return x.gather(2, index).squeeze(2)


def task_header(task, kind: str) -> dict:
    """What every task's ``to_dict`` starts with: its kind and sizes."""
    return {"kind": kind, "d_vocab": task.d_vocab, "n_examples": task.n_examples, "seq_len": task.seq_len}


@dataclass
class MarkovTreeTask:
    """Discrete task: a fixed kernel ``pi`` and root distribution, a fresh tree per context.

    ``sample`` returns tokens ``Int[batch, (L+1)*H]`` in the layout of the module docstring and
    parents ``Int[batch, H]`` with ``parents[:, 0] = -1``.

    Attributes:
        pi: the Markov kernel ``[d, d]``, ``pi[a, b] = pi(b | a)``, rows summing to 1.
        n_examples: L, the number of demonstrations.
        seq_len: H, the tokens in a sequence.
        root: the distribution of x_1 ``[d]``; uniform if None.
    """

    pi: Float[Tensor, "d d"]
    n_examples: int  # L, the number of demonstrations
    seq_len: int  # H, tokens per sequence
    root: Float[Tensor, " d"] | None = None  # distribution of x_1; uniform if None

    def __post_init__(self):
        self.pi = check_kernel(self.pi)
        if self.root is None:
            self.root = torch.full((self.d_vocab,), 1 / self.d_vocab, dtype=torch.float64)
        self.root = check_distribution(self.root, self.d_vocab)
        _, self.n_examples, self.seq_len = check_sizes(self.d_vocab, self.n_examples, self.seq_len)

    @property
    def d_vocab(self) -> int:
        return self.pi.shape[0]

    @property
    def n_tokens(self) -> int:
        """Length of a flat context, (L+1) * H."""
        return (self.n_examples + 1) * self.seq_len

    @classmethod
    def random(
        cls, d_vocab: int, n_examples: int, seq_len: int, alpha: float = 1.0, gamma: float = 0.2, seed: int = 0
    ) -> MarkovTreeTask:
        """A task with a Dirichlet kernel (``dirichlet_kernel``) drawn from ``seed``, uniform root.

        Args:
            d_vocab: d, the number of tokens.
            n_examples: L, the number of demonstrations.
            seq_len: H, the tokens in a sequence.
            alpha: the kernel rows' Dirichlet concentration.
            gamma: the kernel rows' uniform floor.
            seed: the seed the kernel is drawn from.
        """
        check_sizes(d_vocab, n_examples, seq_len)
        g = torch.Generator().manual_seed(check_int(seed, "task seed", 0, MAX_SEED))
        return cls(dirichlet_kernel(d_vocab, alpha, gamma, g), n_examples, seq_len)

    def sample_parents(self, batch: int, generator: torch.Generator | None = None) -> Int[Tensor, "batch H"]:
        """Random trees: ``parents[:, h] ~ Unif{0..h-1}``, ``parents[:, 0] = -1``."""
        h = torch.arange(self.seq_len, dtype=torch.float64)
        u = torch.rand(batch, self.seq_len, dtype=torch.float64, generator=generator)
        parents = torch.floor(u * h).long()
        parents[:, 0] = -1
        return parents

    def sample(
        self, batch: int, generator: torch.Generator | None = None, parents: Int[Tensor, "batch H"] | None = None
    ) -> tuple[Int[Tensor, "batch T"], Int[Tensor, "batch H"]]:
        """Sample ``batch`` contexts (fresh tree each unless ``parents`` is given), vectorised over the batch.

        Args:
            batch: the number of contexts.
            generator: the random source (default: torch's global one); the same seed gives the same contexts.
            parents: the trees to use, ``[batch, H]`` (default: drawn, ``sample_parents``).

        Returns:
            ``(tokens, parents)``: tokens ``[batch, (L+1)*H]``, example-major (flat index ``l * H + h``, the target
            last), and each context's tree ``[batch, H]`` (``parents[:, h]`` is x_h's parent; -1 for the root).
        """
        if parents is None:
            parents = self.sample_parents(batch, generator)
        L1, H = self.n_examples + 1, self.seq_len
        x = torch.empty(batch, L1, H, dtype=torch.long)
        u = torch.rand(batch, L1, H, dtype=torch.float64, generator=generator)
        x[:, :, 0] = _inverse_cdf(self.root.cumsum(0).expand(batch, L1, -1), u[:, :, 0])
        cdf = self.pi.cumsum(-1)
        for h in range(1, H):
            x[:, :, h] = _inverse_cdf(cdf[parent_values(x, parents, h)], u[:, :, h])
        return x.reshape(batch, L1 * H), parents

    def to_dict(self) -> dict:
        return {
            **task_header(self, "markov_tree"),
            "pi": self.pi.tolist(),
            "root": self.root.tolist(),
            "layout": {"order": "example-major"},  # probes.layout: flat index l*H + h, l = n_examples the target
        }

    @classmethod
    def from_dict(cls, d: dict) -> MarkovTreeTask:
        missing = {"pi", "n_examples", "seq_len"} - set(d)
        if missing:
            raise ValueError(f"task description lacks {sorted(missing)}; expected keys pi, n_examples, seq_len")
        if d.get("kind", "markov_tree") != "markov_tree":
            raise ValueError(f"task kind {d['kind']!r} is not supported here; expected 'markov_tree'")
        n_examples = check_int(d["n_examples"], "task n_examples", 1, MAX_N_EXAMPLES)
        seq_len = check_int(d["seq_len"], "task seq_len", 2, MAX_SEQ_LEN)
        d_vocab = check_int(d["d_vocab"], "task d_vocab", 2, MAX_D_VOCAB) if "d_vocab" in d else None
        pi, root = _numbers(d["pi"], "pi", 2), None if d.get("root") is None else _numbers(d["root"], "root", 1)
        if pi.shape[0] > MAX_D_VOCAB:
            raise ValueError(f"task pi is {pi.shape[0]} x {pi.shape[0]}; the bound is d_vocab <= {MAX_D_VOCAB}")
        task = cls(pi, n_examples, seq_len, root)
        if d_vocab is not None and d_vocab != task.d_vocab:
            raise ValueError(f"task d_vocab={d['d_vocab']} disagrees with pi of shape {tuple(task.pi.shape)}")
        return task


def _numbers(value, name: str, ndim: int) -> Tensor:
    """A nested list of real numbers (no bools, no strings) as a float64 tensor of ``ndim`` dims."""
    try:
        t = torch.tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        t = None
    if t is None or t.ndim != ndim or _has_bool(value):
        shape = "a d x d list" if ndim == 2 else "a list"
        raise ValueError(f"task {name} must be {shape} of numbers")
    return t


def _has_bool(value) -> bool:
    return isinstance(value, bool) or (isinstance(value, list) and any(_has_bool(v) for v in value))


def _inverse_cdf(cdf: Float[Tensor, "... d"], u: Float[Tensor, "..."]) -> Int[Tensor, "..."]:
    """Index of the first cdf entry above u (sampling by inverse CDF), clamped for round-off."""
    idx = torch.searchsorted(cdf.contiguous(), u.unsqueeze(-1).contiguous(), right=True).squeeze(-1)
    return idx.clamp_max(cdf.shape[-1] - 1)
