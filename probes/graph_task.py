"""The task family: where the causal graph comes from, where the kernel comes from, one parent or several.

Ours (``probes.tasks.MarkovTreeTask``, kind ``markov_tree``) draws a random tree per context and keeps
one kernel pi for the run. The closest published lines of work study its mirror image, and ``GraphTask``
covers them with the same token layout (L+1 sequences of H tokens, flat index ``l * H + h``, the last
sequence the target; every sequence of a context shares the context's graph and kernel):

- ``graph``: ``random_tree`` (a fresh tree per context, as ours), or fixed for the run: ``chain``
  (parent h-1), ``ngram`` (parents h-n+1..h-1), ``random_dag`` (each position draws ``min(k, h)``
  distinct parents from ``h' < h`` once, from ``graph_seed``; k = 1 is a fixed random tree) or
  ``given`` (a parents list);
- ``kernel``: ``fixed`` (tables drawn once from ``task_seed``, rows ``(1 - gamma) Dirichlet(alpha) +
  gamma / d``, as ours) or ``dirichlet`` (every context draws its own tables, rows ``Dirichlet(alpha)``).

A position with k parents draws from the table of parent count k, ``tables[k]`` of shape ``[d^k, d]``
(row ``sum_j x_{p_j} d^(k-1-j)`` for parents ``p_0 < p_1 < ...``); parentless positions draw from
``root`` (uniform by default), also under the Dirichlet kernel, which keeps its Bayes predictive exact.
This is Nichani et al.'s multi-parent DAG task; Edelman et al. and Chen et al. draw the first token(s)
from the chain's stationary distribution instead, which the oracle could not treat in closed form.

The peers use one sequence per context: ``n_examples = 0`` is allowed here (the target alone).
``parse_spec`` reads the trainers' ``--task-kind`` value, ``make_task`` builds the task it names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

from probes.jax_random import nichani_dags
from probes.tasks import (
    MAX_D_VOCAB,
    MAX_N_EXAMPLES,
    MAX_N_TOKENS,
    MAX_SEED,
    MAX_SEQ_LEN,
    MarkovTreeTask,
    _gamma_sample,
    _inverse_cdf,
    check_distribution,
    check_float,
    check_int,
    check_kernel,
    dirichlet_rows,
    task_header,
)

GRAPHS = ("random_tree", "chain", "ngram", "random_dag", "given", "nichani_dag")
KERNELS = ("fixed", "dirichlet")
SPEC_KEYS = {"kernel", "n", "parents", "seed", "index", "root"}
ROOTS = ("uniform", "stationary")
SPEC_HELP = (
    "GRAPH[:key=value...] with GRAPH one of random_tree, chain, ngram, random_dag, given, nichani_dag and keys "
    "kernel=fixed|dirichlet, n=N (ngram), parents=K (random_dag) or parents=[[],[0],...] (given), seed=S (random_dag, "
    "nichani_dag), index=I (nichani_dag: their I-th of 20 DAGs, 0-19), root=uniform|stationary (parentless tokens)"
)
MAX_TABLE_ROWS = 2**16  # d^k rows of the table of parent count k
MAX_KERNEL_ENTRIES = 2**27  # per-context kernels of one batch (float64: 1 GiB)


def check_graph(parents, seq_len: int, name: str = "task parents") -> list[list[int]]:
    """A DAG over positions in sequence order: ``parents[h]`` distinct integers below h (position 0 has
    none). One ValueError naming the first offending position otherwise (a cycle is named as one)."""
    if not isinstance(parents, (list, tuple)) or len(parents) != seq_len:
        raise ValueError(f"{name} must be a list of {seq_len} lists (one per position), got {parents!r:.80}")
    out = []
    for h, ps in enumerate(parents):
        if not isinstance(ps, (list, tuple)):
            raise ValueError(f"{name}[{h}] must be a list of positions, got {ps!r}")
        ps = [check_int(p, f"{name}[{h}] entry", 0, seq_len - 1) for p in ps]
        if len(set(ps)) != len(ps):
            raise ValueError(f"{name}[{h}] repeats a parent: {ps}")
        late = [p for p in ps if p >= h]
        if late:
            what = "has a cycle through" if _on_cycle(parents, h) else "is not in sequence order at"
            raise ValueError(
                f"{name} is not a DAG in sequence order: the graph {what} position {h} (parent {late[0]} >= {h}); "
                "every parent must come before its child"
            )
        out.append(sorted(ps))
    return out


def _on_cycle(parents, start: int) -> bool:
    """Whether ``start`` is its own ancestor (following parent lists; entries already range-checked)."""
    seen, stack = set(), list(parents[start])
    while stack:
        p = stack.pop()
        if p == start:
            return True
        if p not in seen and 0 <= p < len(parents):
            seen.add(p)
            stack.extend(q for q in parents[p] if isinstance(q, int))
    return False


N_NICHANI_DAGS = 20  # their many_graphs.ipynb draws 20 DAGs at once (the keys depend on the count)


def fixed_graph(
    kind: str, seq_len: int, n: int = 2, n_parents: int = 1, seed: int = 0, parents=None, index: int = 0
) -> list[list[int]]:
    """The parents lists of a fixed graph: ``chain``, ``ngram`` (n), ``random_dag`` (n_parents, seed), ``given``,
    ``nichani_dag`` (index, seed: ``probes.jax_random.nichani_dags(20, seed, seq_len - 1)[index]`` on positions
    0..H-3, their DAG at their T = H - 1; then their test token H - 2, a root, and its child H - 1). The test
    token is drawn from ``root`` (uniform) also under ``root=stationary`` with a Dirichlet kernel, as their
    ``jr.choice(vocab_size)``; the DAG's own roots from the context's stationary distribution, as theirs."""
    H = seq_len
    if kind == "nichani_dag":
        i = check_int(index, "nichani_dag index", 0, N_NICHANI_DAGS - 1)
        if H < 4:
            raise ValueError(f"nichani_dag needs seq_len >= 4 (their T = seq_len - 1), got {H}")
        dag = nichani_dags(N_NICHANI_DAGS, check_int(seed, "nichani_dag seed", 0, 2**32 - 1), H - 1)[i]
        return [[] if p < 0 else [p] for p in dag] + [[], [H - 2]]
    if kind == "chain":
        return [[] if h == 0 else [h - 1] for h in range(H)]
    if kind == "ngram":
        n = check_int(n, "ngram n", 2, H)
        return [list(range(max(0, h - n + 1), h)) for h in range(H)]
    if kind == "random_dag":
        k = check_int(n_parents, "random_dag parents", 1, H - 1)
        g = torch.Generator().manual_seed(check_int(seed, "random_dag seed", 0, MAX_SEED))
        return [sorted(torch.randperm(h, generator=g)[: min(k, h)].tolist()) if h else [] for h in range(H)]
    if kind == "given":
        if parents is None:
            raise ValueError("a given graph needs parents=[[...], ...] (one list per position)")
        return check_graph(parents, H)
    raise ValueError(f"graph {kind!r} is not fixed; expected one of chain, ngram, random_dag, given")


@dataclass
class GraphTask:
    """A member of the family (module docstring). ``parents`` is the fixed graph (None for
    ``random_tree``), ``tables`` the fixed kernel by parent count (None for ``kernel='dirichlet'``).
    Build one with ``make_task``.

    Attributes:
        d_vocab: d, the number of tokens.
        n_examples: L, the number of demonstrations (0: one sequence per context).
        seq_len: H, the tokens in a sequence.
        graph: ``random_tree``, ``chain``, ``ngram``, ``random_dag``, ``given`` or ``nichani_dag``.
        kernel: ``fixed`` (tables drawn once) or ``dirichlet`` (each context draws its own rows).
        parents: the fixed graph, each position's parents (None for ``random_tree``).
        tables: the fixed kernel's rows by parent count k, ``[d**k, d]`` (None for ``dirichlet``).
        alpha: the Dirichlet concentration of the per-context kernel.
        root: the distribution of parentless tokens ``[d]``; uniform if None.
        spec: the ``--task-kind`` value that built it.
        stationary_root: roots drawn from each context's own stationary distribution.
    """

    d_vocab: int
    n_examples: int  # L demonstrations; 0 allowed (one sequence per context)
    seq_len: int  # H
    graph: str = "chain"
    kernel: str = "dirichlet"
    parents: list[list[int]] | None = None
    tables: dict[int, Float[Tensor, "rows d"]] | None = None
    alpha: float = 1.0  # Dirichlet concentration of the per-context kernel
    root: Float[Tensor, " d"] | None = None  # distribution of parentless tokens; uniform if None
    spec: str = ""  # the --task-kind value that built it (for the record)
    stationary_root: bool = False  # dirichlet kernel: roots from each context's own stationary distribution
    _counts: list[int] = field(default_factory=list, repr=False)  # parent count of each position

    def __post_init__(self):
        self.d_vocab = check_int(self.d_vocab, "task d_vocab", 2, MAX_D_VOCAB)
        self.n_examples = check_int(self.n_examples, "task n_examples", 0, MAX_N_EXAMPLES)
        self.seq_len = check_int(self.seq_len, "task seq_len", 2, MAX_SEQ_LEN)
        if self.n_tokens > MAX_N_TOKENS:
            raise ValueError(f"task contexts of (L+1)H = {self.n_tokens} tokens exceed the bound of {MAX_N_TOKENS}")
        if self.graph not in GRAPHS:
            raise ValueError(f"task graph {self.graph!r} is unknown; expected one of {', '.join(GRAPHS)}")
        if self.kernel not in KERNELS:
            raise ValueError(f"task kernel {self.kernel!r} is unknown; expected one of {', '.join(KERNELS)}")
        if self.graph == "random_tree" and self.kernel == "fixed":
            raise ValueError("a random tree per context with a fixed kernel is our task: kind markov_tree")
        self.alpha = check_float(self.alpha, "alpha", 0, open_low=True)
        if self.graph == "random_tree":
            if self.parents is not None:
                raise ValueError("a random_tree task draws its tree per context; it takes no parents list")
            self._counts = [0] + [1] * (self.seq_len - 1)
        else:
            self.parents = check_graph(self.parents, self.seq_len)
            self._counts = [len(p) for p in self.parents]
        d = self.d_vocab
        for k in self.parent_counts:
            if d**k > MAX_TABLE_ROWS:
                raise ValueError(
                    f"a position with {k} parents needs a table of d^k = {d}^{k} rows; the bound is {MAX_TABLE_ROWS}"
                )
        if self.kernel == "fixed":
            if not isinstance(self.tables, dict) or set(self.tables) != set(self.parent_counts):
                got = None if not isinstance(self.tables, dict) else sorted(self.tables)
                raise ValueError(f"a fixed kernel needs tables for parent counts {self.parent_counts}, got {got}")
            self.tables = {k: _check_table(t, d, k) for k, t in self.tables.items()}
        elif self.tables is not None:
            raise ValueError("a dirichlet kernel is drawn per context; it takes no tables")
        if self.stationary_root and (self.kernel != "dirichlet" or 1 not in self.parent_counts):
            raise ValueError(
                "root=stationary draws roots from each context's single-parent table: it needs kernel=dirichlet and "
                "a position with one parent (a fixed kernel's stationary root is a fixed root, set by make_task)"
            )
        if self.root is None:
            self.root = torch.full((d,), 1 / d, dtype=torch.float64)
        self.root = check_distribution(self.root, d)

    @property
    def n_tokens(self) -> int:
        return (self.n_examples + 1) * self.seq_len

    @property
    def parent_counts(self) -> list[int]:
        """The parent counts k >= 1 that occur (one kernel table each)."""
        return sorted(set(self._counts) - {0})

    @property
    def max_parents(self) -> int:
        return max(self._counts)

    @property
    def pi(self) -> Float[Tensor, "d d"]:
        """The single-parent kernel of a fixed-kernel task (what ``probes.bma`` and the strategies read)."""
        if self.kernel != "fixed" or 1 not in self.tables:
            raise ValueError(f"a {self.kernel} kernel on a {self.graph} graph has no fixed single-parent pi")
        return self.tables[1]

    def sample_kernels(self, batch: int, generator: torch.Generator | None = None) -> dict[int, Tensor]:
        """Per-context tables ``{k: [batch, d^k, d]}`` (Dirichlet(alpha) rows; the fixed tables expanded)."""
        d = self.d_vocab
        if self.kernel == "fixed":
            return {k: t.expand(batch, -1, -1) for k, t in self.tables.items()}
        g = generator if generator is not None else torch.default_generator
        entries = sum(batch * d**k * d for k in self.parent_counts)
        if entries > MAX_KERNEL_ENTRIES:
            raise ValueError(
                f"a batch of {batch} contexts with their own kernels holds {entries} probabilities (d = {d}, parent "
                f"counts {self.parent_counts}); the bound is {MAX_KERNEL_ENTRIES}: use a smaller batch or vocabulary"
            )
        out = {}
        for k in self.parent_counts:
            gam = _gamma_sample(batch * d**k * d, self.alpha, g).view(batch, d**k, d)
            rows = gam / gam.sum(-1, keepdim=True)
            if not torch.isfinite(rows).all():
                raise ValueError(f"alpha={self.alpha!r} is too small: Dirichlet draws underflow to zero")
            out[k] = rows
        return out

    def graph_of(self, batch: int, generator: torch.Generator | None = None) -> Int[Tensor, "batch H P"]:
        """Each context's parents, ``[batch, H, P]`` (P = the largest parent count) padded with -1: a
        fresh random tree per context (``MarkovTreeTask.sample_parents``' draws), else the fixed graph."""
        H = self.seq_len
        if self.graph == "random_tree":
            return MarkovTreeTask.sample_parents(self, batch, generator).unsqueeze(-1)
        P = max(self.max_parents, 1)
        fixed = torch.full((H, P), -1, dtype=torch.long)
        for h, ps in enumerate(self.parents):
            fixed[h, : len(ps)] = torch.tensor(ps, dtype=torch.long)
        return fixed.expand(batch, H, P)

    def sample(
        self, batch: int, generator: torch.Generator | None = None, kernels: dict[int, Tensor] | None = None
    ) -> tuple[Int[Tensor, "batch T"], Int[Tensor, "batch H"] | Int[Tensor, "batch H P"]]:
        """``batch`` contexts and their parents: ``[batch, H]`` (-1 at parentless positions) when every
        position has at most one parent, else ``[batch, H, P]`` padded with -1. Draws, in order: the
        trees (random_tree), the kernels (dirichlet, unless ``kernels`` given), one uniform per token.
        With a fixed graph and kernel these are ``MarkovTreeTask.sample``'s draws given the same parents."""
        parents = self.graph_of(batch, generator)
        tables = self.sample_kernels(batch, generator) if kernels is None else kernels
        L1, H, d = self.n_examples + 1, self.seq_len, self.d_vocab
        x = torch.empty(batch, L1, H, dtype=torch.long)
        u = torch.rand(batch, L1, H, dtype=torch.float64, generator=generator)
        cdfs = {k: t.cumsum(-1) for k, t in tables.items()}
        root_cdf = plain_cdf = self.root.cumsum(0).expand(batch, L1, -1)
        if self.stationary_root:  # Edelman's and Nichani's roots: the context's own chain, at equilibrium
            root_cdf = stationary_batch(tables[1]).cumsum(-1).unsqueeze(1).expand(-1, L1, -1)
        test = H - 2 if self.graph == "nichani_dag" else None  # their test token: from root (fixed_graph)
        for h in range(H):
            ps = parents[:, h]  # [batch, P]
            k = self._counts[h]
            if k == 0:
                x[:, :, h] = _inverse_cdf(plain_cdf if h == test else root_cdf, u[:, :, h])
                continue
            row = parent_rows(x, ps[:, :k], d)  # [batch, L1]
            cdf = cdfs[k].gather(1, row.unsqueeze(-1).expand(-1, -1, d))  # [batch, L1, d]
            x[:, :, h] = _inverse_cdf(cdf, u[:, :, h])
        return x.reshape(batch, L1 * H), parents.squeeze(-1) if parents.shape[-1] == 1 else parents

    def to_dict(self) -> dict:
        out = {
            **task_header(self, "graph"),
            "graph": self.graph,
            "kernel": self.kernel,
            "spec": self.spec,
            "parents": self.parents,
            "alpha": self.alpha,
            "root": self.root.tolist(),
            "stationary_root": self.stationary_root,
            "layout": {"order": "example-major"},  # probes.layout: flat index l*H + h, l = n_examples the target
        }
        if self.kernel == "fixed":
            out["tables"] = {str(k): t.tolist() for k, t in self.tables.items()}
        return out

    @classmethod
    def from_dict(cls, d: dict) -> GraphTask:
        missing = {"d_vocab", "n_examples", "seq_len", "graph", "kernel"} - set(d)
        if missing:
            raise ValueError(f"graph task description lacks {sorted(missing)}")
        tables = d.get("tables")
        if tables is not None:
            if not isinstance(tables, dict) or not all(isinstance(k, str) and k.isdigit() for k in tables):
                raise ValueError("task tables must be an object {parent count: table}")
            tables = {int(k): torch.tensor(v, dtype=torch.float64) for k, v in tables.items()}
        root = None if d.get("root") is None else torch.tensor(d["root"], dtype=torch.float64)
        return cls(
            d["d_vocab"], d["n_examples"], d["seq_len"], d["graph"], d["kernel"], d.get("parents"), tables,
            d.get("alpha", 1.0), root, d.get("spec", ""), bool(d.get("stationary_root", False)),
        )  # fmt: skip


def stationary_batch(pi: Float[Tensor, "... d d"]) -> Float[Tensor, "... d"]:
    """The stationary distribution of each row-stochastic kernel (the left eigenvector for eigenvalue 1)."""
    evals, evecs = torch.linalg.eig(pi.double().transpose(-1, -2))
    idx = (evals - 1).abs().argmin(-1)  # [...]
    v = evecs.gather(-1, idx[..., None, None].expand(*evecs.shape[:-1], 1))[..., 0].real
    v = (v / v.sum(-1, keepdim=True)).clamp_min(0)
    return v / v.sum(-1, keepdim=True)


def relative_offsets(parents: list[list[int]] | None) -> list[int] | None:
    """The offsets o >= 1 at which every position h finds its parents, ``parents[h] = {h - o : o in offsets,
    h - o >= 0}`` (a chain: [1]; an n-gram: [1, ..., n-1]), or None: a graph whose parents sit at offsets that
    differ between positions (a random DAG), or one drawn per context (``parents`` None). A model that reads
    relative positions only can represent the first kind alone."""
    if parents is None:
        return None
    offsets = sorted({h - p for h, ps in enumerate(parents) for p in ps})
    same = all(sorted(ps) == sorted(h - o for o in offsets if h - o >= 0) for h, ps in enumerate(parents))
    return offsets if same else None


def context_order(task) -> int:
    """How many preceding tokens of its own sequence a prediction conditions on: n - 1 on an n-gram task,
    1 otherwise (the order of the k-gram strategies and of the induction score)."""
    return task.max_parents if isinstance(task, GraphTask) and task.graph == "ngram" else 1


def parent_rows(x: Int[Tensor, "batch L1 H"], ps: Int[Tensor, "batch k"], d: int) -> Int[Tensor, "batch L1"]:
    """Row of the table of parent count k: ``sum_j x[:, :, ps_j] d^(k-1-j)`` (first parent most significant)."""
    vals = x.gather(2, ps.unsqueeze(1).expand(-1, x.shape[1], -1))  # [batch, L1, k]
    weights = d ** torch.arange(ps.shape[1] - 1, -1, -1)
    return (vals * weights).sum(-1)


def _check_table(t, d: int, k: int) -> Tensor:
    t = torch.as_tensor(t, dtype=torch.float64)
    if t.shape != (d**k, d):
        raise ValueError(f"the kernel table for {k} parents must be [d^k, d] = [{d**k}, {d}], got {tuple(t.shape)}")
    return check_kernel(t.reshape(-1, d), f"kernel table {k}") if k == 1 else _rows(t, k)


def _rows(t: Tensor, k: int) -> Tensor:
    """Validate a [rows, d] row-stochastic table (check_kernel wants a square matrix)."""
    if not torch.isfinite(t).all() or (t < 0).any() or ((t.sum(-1) - 1).abs() > 1e-6).any():
        raise ValueError(f"kernel table {k} must have finite, non-negative rows summing to 1")
    return t


def parse_spec(spec: str) -> dict:
    """``--task-kind`` for the family, ``GRAPH[:key=value...]`` (``SPEC_HELP``) -> a dict of its parts.
    One ValueError naming what was wrong and what is expected."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"expected a string, got {spec!r}")
    graph, *options = spec.split(":")
    if graph in ("markov_tree", "continuous"):
        raise ValueError(f"{graph} takes no options; expected {graph} alone")
    if graph not in GRAPHS:
        raise ValueError(f"{graph!r} is unknown; expected markov_tree, continuous or {SPEC_HELP}")
    out: dict = {"graph": graph, "kernel": "fixed"}
    for opt in options:
        key, eq, value = opt.partition("=")
        if not eq or key not in SPEC_KEYS:
            raise ValueError(f"option {opt!r} is not key=value with key in {sorted(SPEC_KEYS)}")
        if key == "root":
            if value not in ROOTS:
                raise ValueError(f"root={value!r}; expected uniform or stationary")
            out["root"] = value
        elif key == "kernel":
            if value not in KERNELS:
                raise ValueError(f"kernel={value!r}; expected fixed or dirichlet")
            out["kernel"] = value
        elif key == "parents" and graph == "given":
            try:
                out["parents"] = json.loads(value)
            except json.JSONDecodeError:
                raise ValueError(f"parents={value!r} is not a JSON list of lists") from None
        else:
            try:
                out[key] = int(value)
            except ValueError:
                raise ValueError(f"{key}={value!r} must be an integer") from None
    allowed = {
        "random_tree": set(),
        "chain": set(),
        "ngram": {"n"},
        "random_dag": {"parents", "seed"},
        "given": {"parents"},
        "nichani_dag": {"index", "seed"},
    }
    extra = set(out) - {"graph", "kernel", "root"} - allowed[graph]
    if extra:
        raise ValueError(f"{graph} takes no option {sorted(extra)[0]!r}")
    if graph == "ngram" and "n" not in out:
        raise ValueError("ngram needs n=N (N >= 2)")
    if graph == "given" and "parents" not in out:
        raise ValueError("given needs parents=[[],[0],...]")
    return out


def make_task(
    spec: str, d_vocab: int, n_examples: int, seq_len: int, alpha: float = 1.0, gamma: float = 0.2, task_seed: int = 0
) -> MarkovTreeTask | GraphTask:
    """The task ``spec`` names (``markov_tree``: ours, exactly ``MarkovTreeTask.random``; else ``parse_spec``).
    A fixed kernel draws its tables from ``task_seed`` (the single-parent one is ours for the same seed).

    Args:
        spec: ``markov_tree`` or ``GRAPH[:key=value...]`` (``--task-kind``; e.g. ``ngram:n=3``,
            ``random_dag:parents=2,seed=1``, ``chain:kernel=fixed``).
        d_vocab: d, the number of tokens.
        n_examples: L, the number of demonstrations.
        seq_len: H, the tokens in a sequence.
        alpha: the Dirichlet concentration of either kernel.
        gamma: the fixed kernel's uniform floor.
        task_seed: the seed of a fixed kernel's tables.

    Returns:
        A ``MarkovTreeTask`` (ours) or a ``GraphTask``.

    Raises:
        ValueError: an unknown kind, a graph that is not a DAG, or a bad size, in one line.
    """
    if spec == "markov_tree":
        return MarkovTreeTask.random(d_vocab, n_examples, seq_len, alpha, gamma, task_seed)
    seq_len = check_int(seq_len, "seq_len", 2, MAX_SEQ_LEN)
    try:
        parts = parse_spec(spec)
        graph, kernel = parts["graph"], parts["kernel"]
        parents = None
        if graph != "random_tree":
            parents = fixed_graph(
                graph, seq_len, parts.get("n", 2), parts.get("parents", 1), parts.get("seed", 0), parts.get("parents"),
                parts.get("index", 0),
            )
    except ValueError as e:
        raise ValueError(f"task_kind {spec!r}: {e}") from None
    if graph == "random_tree" and kernel == "fixed":
        return MarkovTreeTask.random(d_vocab, n_examples, seq_len, alpha, gamma, task_seed)
    tables, root, stationary_root = None, None, parts.get("root") == "stationary"
    if kernel == "fixed":
        d = check_int(d_vocab, "d_vocab", 2, MAX_D_VOCAB)
        g = torch.Generator().manual_seed(check_int(task_seed, "task seed", 0, MAX_SEED))
        counts = sorted({len(p) for p in parents} - {0})
        tables = {k: dirichlet_rows(d**k, d, alpha, gamma, g) for k in counts}
        if stationary_root:  # one kernel for the run: its stationary distribution is a fixed root
            if 1 not in tables:
                raise ValueError(f"task_kind {spec!r}: root=stationary needs a position with one parent")
            root, stationary_root = stationary_batch(tables[1]), False
    return GraphTask(d_vocab, n_examples, seq_len, graph, kernel, parents, tables, alpha, root, spec, stationary_root)
