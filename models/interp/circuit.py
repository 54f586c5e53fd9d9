"""Circuit discovery on any subject: the graph of senders and receivers, exact edge patching, attribution
patching (EAP, EAP-IG), and the run of a circuit with every other edge ablated.

The graph (``build_graph``). Nodes: the token and position embeddings, each attention head, each MLP, the
output. An edge runs from a sender into one input of a later receiver (a head's query, key and value
inputs are separate receivers; an MLP's input; the output), at one group of positions (the positions'
role in the task: ``demonstrations``, ``target``, ``other`` for BOS and separators). For the disentangled
model the senders into layer 1 are the subspaces of its concatenated residual (subspace 0 the token,
subspace k+1 copyer k's write), so an edge there is exact, not a projection.

One mechanism for every family: a receiver is a pair of hooks, ``site`` (the residual it reads) and
``capture`` (its own activation, computed from that residual position by position or, for the content-free
copyers, from that residual alone). Editing a receiver's input = one pass with the edit at ``site`` in which
``capture`` is recorded, then the real pass with the recorded activation patched in
(``models.interp.interventions.Intervention``). That needs no split-input hooks (``use_split_qkv_input``), which a
TransformerBridge and our disentangled model do not offer in the same way; on the bridge the MLP's site is
``blocks.i.hook_resid_mid``, which there feeds only ln_2 (tests/test_circuit.py checks every site and
capture per family, and that the bridge's resid_mid edit does not reach the residual stream).

Peer tools. auto-circuit (PyPI ``auto-circuit``) and the ACDC / EAP code bases build their graph by
patching a TransformerLens 2.x ``HookedTransformer`` with split q/k/v inputs (``use_split_qkv_input``). They
do run on our GPT-2 subjects, converted by hand to a TransformerLens 2.x HookedTransformer in an environment
of its own (docs/results/circuit.md says how): there auto-circuit 1.0.1 reproduced this module's exact and
EAP edge scores on the shipped GPT-2 to 3e-8, and the same circuit and faithfulness. They cannot run in
this suite's environment (TransformerLens >= 4.3, whose standard model is a TransformerBridge without
HookedTransformer's split inputs), nor on our disentangled model, whose residual is a concatenation whose
layers have different widths and head counts. ``transformer_lens.patching`` patches one activation per cell
and cannot express an edge (a sender's change seen by one receiver only). What we take from them: the
graph (senders, receivers with q/k/v apart), the scores (ACDC's edge ablation, EAP's gradient times the
change, EAP-IG's integrated gradients over the inputs), the searches and the JSON, and ROC AUC against
circuits known in advance.

Node ablation (``node_ablated_values``): every head and MLP outside a set of nodes set to its mean over
held-out contexts (``mean``) or its value on a fresh context of the task (``resample``), at every position:
the circuit's sufficiency, which does not depend on a corruption that keeps part of the context.

Conventions. Scores are "noising" by default: ``score(edge) = metric(clean run, the edge's receiver seeing
its sender's ablated value) - metric(clean run)``; with the default metric (target NLL) a positive score is
a cost. The ablated value of a sender is its value in a run on other contexts (``CORRUPTIONS``: another
tree's demonstrations, the target re-drawn, fresh contexts) or its mean over held-out contexts.
"Denoising" (``denoising_runner``) is the mirror image: the base run is the corrupted one, an edge's
receiver sees its sender's clean value, and the metric is still that of the clean targets, so a negative
score restores what the corruption cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from jaxtyping import Float, Int
from torch import Tensor

from models.interp.interventions import Intervention, corrupted_contexts
from models.interp.subject import DISENTANGLED, Subject, head_label
from probes.metrics import per_context_nll

INPUTS = ("q", "k", "v")
CORRUPTIONS = {
    "demonstrations": "demonstrations from another tree (the same target)",
    "target": "the target's tokens re-drawn uniformly (the same demonstrations)",
    "resample": "fresh contexts",
    "mean": "the sender's mean over held-out contexts",
}
DIRECTIONS = ("noising", "denoising")


@dataclass(frozen=True)
class Edge:
    """Sender ``sender`` into input ``input`` (q, k, v; ``in`` of an MLP; ``out`` of the output) of node
    ``receiver`` at the positions of group ``group``."""

    sender: str
    receiver: str
    input: str
    group: str

    @property
    def label(self) -> str:
        return f"{self.sender}->{self.receiver}.{self.input}@{self.group}"

    def to_dict(self) -> dict:
        return {"sender": self.sender, "receiver": self.receiver, "input": self.input, "group": self.group}


@dataclass(frozen=True)
class Receiver:
    """One input of one node: ``site`` is the residual it reads, ``capture`` (with ``head``) the activation
    it computes from it (None: the output, read from ``site`` itself). ``level`` orders receivers: every
    receiver of a level reads senders of lower levels only, and the receivers of a level share one site.
    ``positionwise``: the activation at a position reads the site at that position only (a head's q, k, v
    and an MLP; not the content-free copyers, which read every position)."""

    node: str
    input: str
    site: str
    capture: str | None
    head: int | None
    level: int
    positionwise: bool = True


@dataclass(frozen=True)
class Sender:
    """A node's write into the residual: ``hook``'s activation, head ``head`` through ``W_O`` (standard
    heads), or its last-axis ``dims`` placed into an otherwise zero residual (disentangled subspaces). A
    disentangled sender's write reaches a different site at layer 0 and at layer 1: ``at`` maps a site to
    its (hook, dims) there. ``level``: its value is final once receivers of lower levels are computed."""

    node: str
    level: int
    at: dict = field(compare=False)  # site -> (hook, head, dims)
    W_O: Tensor | None = field(default=None, repr=False, compare=False)  # [head, d_head, d_model]

    def write(self, cache: dict, site: str) -> Tensor:
        """The sender's write as the residual at ``site`` holds it, ``[batch, pos, D]``."""
        hook, head, dims = self.at[site]
        act = cache[hook]
        if head is not None:
            return act[:, :, head] @ self.W_O[head].to(act.dtype)
        if dims is None:
            return act
        out = torch.zeros_like(act)
        out[..., dims[0] : dims[1]] = act[..., dims[0] : dims[1]]
        return out


@dataclass
class Graph:
    """Senders, receivers, the positions of each group at each site, and every edge."""

    senders: list[Sender]
    receivers: list[Receiver]
    groups: dict  # site -> {group: [positions]}
    edges: list[Edge]
    family: str

    def __post_init__(self):
        self._receivers = {(r.node, r.input): r for r in self.receivers}
        sites = {}
        for r in self.receivers:
            if sites.setdefault(r.level, r.site) != r.site:
                raise ValueError(f"receivers of level {r.level} read two sites, {sites[r.level]} and {r.site}")

    def sender(self, name: str) -> Sender:
        return next(s for s in self.senders if s.node == name)

    def receiver(self, node: str, input: str) -> Receiver:
        return self._receivers[(node, input)]

    def receiver_of(self, edge: Edge) -> Receiver:
        return self._receivers[(edge.receiver, edge.input)]

    @property
    def sender_hooks(self) -> list[str]:
        return sorted({h for s in self.senders for h, _, _ in s.at.values()})

    def nodes(self, edges) -> list[str]:
        """Heads and MLPs that some edge of ``edges`` enters or leaves (embeddings and the output apart)."""
        names = {e.sender for e in edges} | {e.receiver for e in edges}
        return [n for n in self.node_order if n in names and n not in ("embed", "pos_embed", "output")]

    @property
    def node_order(self) -> list[str]:
        seen = []
        for n in [s.node for s in self.senders] + [r.node for r in self.receivers]:
            if n not in seen:
                seen.append(n)
        return seen

    def find(self, label: str) -> Edge:
        for e in self.edges:
            if e.label == label:
                return e
        raise ValueError(f"no edge {label!r} in this graph; edges look like {self.edges[0].label!r}")


def _check_hooks(subject: Subject, names) -> None:
    missing = [n for n in names if n not in subject.model.hook_dict]
    if missing:
        raise ValueError(
            f"--checkpoint {subject.name}: circuit discovery needs the hooks {', '.join(missing[:4])}"
            f"{' ...' if len(missing) > 4 else ''}, which this model has not (a {subject.describe()})"
        )


def build_graph(subject: Subject) -> Graph:
    """The graph of ``subject`` (see the module docstring); ValueError if it lacks a hook the graph uses."""
    if DISENTANGLED in subject.capabilities:
        return _disentangled_graph(subject)
    return _standard_graph(subject)


def _edges(senders, receivers, groups) -> list[Edge]:
    return [
        Edge(s.node, r.node, r.input, g)
        for r in receivers
        for s in senders
        if s.level <= r.level and r.site in s.at
        for g in groups[r.site]
    ]


def _disentangled_graph(subject: Subject) -> Graph:
    L, H, d = subject.task.n_examples, subject.task.seq_len, subject.task.d_vocab
    K = subject.n_heads[0]
    site0, site1, out = "blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"
    res0 = "blocks.0.hook_resid_post"
    _check_hooks(subject, ["hook_embed", site0, res0, site1, out, "blocks.0.attn.hook_z",
                           *(f"blocks.1.attn.hook_{x}" for x in INPUTS)])  # fmt: skip
    senders = [Sender("embed", 0, {site0: ("hook_embed", None, None), site1: (res0, None, (0, d))})]
    senders += [Sender(head_label(0, k), 1, {site1: (res0, None, ((k + 1) * d, (k + 2) * d))}) for k in range(K)]
    senders += [Sender(head_label(1, 0), 2, {out: (out, None, None)})]
    receivers = [Receiver(head_label(0, k), "v", site0, "blocks.0.attn.hook_z", k, 0, positionwise=False)
                 for k in range(K)]  # fmt: skip
    receivers += [Receiver(head_label(1, 0), x, site1, f"blocks.1.attn.hook_{x}", 0, 1) for x in INPUTS]
    receivers += [Receiver("output", "out", out, None, None, 2)]
    groups = {
        site0: {"demonstrations": list(range(L * H)), "target": list(range(L * H, (L + 1) * H))},
        site1: {"target": list(range(H))},
        out: {"target": list(range(H))},
    }
    return Graph(senders, receivers, groups, _edges(senders, receivers, groups), "disentangled")


def _standard_graph(subject: Subject) -> Graph:
    model, n = subject.model, subject.n_layers
    has_mlp = [f"blocks.{i}.hook_mlp_out" in model.hook_dict for i in range(n)]
    need = ["hook_embed"] + [f"blocks.{i}.hook_resid_pre" for i in range(n)] + [f"blocks.{n - 1}.hook_resid_post"]
    need += [f"blocks.{i}.attn.hook_{x}" for i in range(n) for x in (*INPUTS, "z")]
    need += [f"blocks.{i}.hook_{x}" for i in range(n) if has_mlp[i] for x in ("resid_mid", "mlp_out")]
    _check_hooks(subject, need)
    if not all(hasattr(model.blocks[i].attn, "W_O") for i in range(n)):
        raise ValueError(f"--checkpoint {subject.name}: circuit discovery needs each layer's attn.W_O")
    layout = subject.layout
    final = f"blocks.{n - 1}.hook_resid_post"
    sites = [f"blocks.{i}.hook_resid_pre" for i in range(n)] + [f"blocks.{i}.hook_resid_mid" for i in range(n)]
    sites.append(final)

    def everywhere(hook, head=None):
        return {s: (hook, head, None) for s in sites}

    senders = [Sender("embed", 0, everywhere("hook_embed"))]
    if "hook_pos_embed" in model.hook_dict:
        senders.append(Sender("pos_embed", 0, everywhere("hook_pos_embed")))
    receivers = []
    for i in range(n):
        W_O = model.blocks[i].attn.W_O.detach()
        for j in range(subject.n_heads[i]):
            receivers += [Receiver(head_label(i, j), x, f"blocks.{i}.hook_resid_pre", f"blocks.{i}.attn.hook_{x}", j,
                                   2 * i) for x in INPUTS]  # fmt: skip
            senders.append(Sender(head_label(i, j), 2 * i + 1, everywhere(f"blocks.{i}.attn.hook_z", j), W_O))
        if has_mlp[i]:
            receivers.append(Receiver(f"MLP{i}", "in", f"blocks.{i}.hook_resid_mid", f"blocks.{i}.hook_mlp_out",
                                      None, 2 * i + 1))  # fmt: skip
            senders.append(Sender(f"MLP{i}", 2 * i + 2, everywhere(f"blocks.{i}.hook_mlp_out")))
    receivers.append(Receiver("output", "out", final, None, None, 2 * n))
    # A head of layer i reads resid_pre i (senders of levels <= 2i); layer i's MLP also reads its heads.
    keys = layout.key_tokens()  # [T, 2]: (l, h) of each position's task token, (-1, -1) for none
    L = subject.task.n_examples
    role = {"demonstrations": (keys[:, 0] >= 0) & (keys[:, 0] < L), "target": keys[:, 0] == L, "other": keys[:, 0] < 0}
    by_role = {g: torch.nonzero(m).flatten().tolist() for g, m in role.items() if m.any()}
    groups = {s: by_role for s in sites}
    return Graph(senders, receivers, groups, _edges(senders, receivers, groups), "standard")


# Runs ---------------------------------------------------------------------------------------------------
Metric = Callable[[Tensor, Tensor], Tensor]  # (log_probs [batch, H, d], tokens [batch, T]) -> each context's [batch]
ROWS = 512  # contexts x copies per forward pass: much larger batches spend their time faulting in fresh memory


def sender_writes(subject: Subject, graph: Graph, tokens, fwd_hooks=()) -> tuple[dict, Tensor]:
    """Every sender's write at every site it reaches, ``{(node, site): [batch, pos, D]}``, and the log-probs."""
    cache: dict = {}
    hooks = [*fwd_hooks, *(Intervention(h, "record", store=cache).fwd_hook() for h in graph.sender_hooks)]
    with torch.no_grad():
        lp = subject.log_probs(tokens, hooks)
    return {(s.node, site): s.write(cache, site) for s in graph.senders for site in s.at}, lp


def mean_writes(writes: dict) -> dict:
    """Each write averaged over contexts (``[1, pos, D]``): the values of mean ablation."""
    return {k: v.mean(0, keepdim=True) for k, v in writes.items()}


def other_contexts(task, tokens: Int[Tensor, "batch T"], corruption: str, seed: int) -> Int[Tensor, "batch T"]:
    """The contexts whose run gives the senders' ablated values under ``corruption`` (``CORRUPTIONS``):
    the demonstrations from another tree, the target's tokens re-drawn uniformly, or fresh contexts (for
    ``resample`` and, averaged, for ``mean``: held out from ``tokens``)."""
    if corruption not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}; expected one of {', '.join(CORRUPTIONS)}")
    g = torch.Generator().manual_seed(seed + 7919)
    if corruption == "demonstrations":
        return corrupted_contexts(task, tokens, g)[0]
    if corruption == "target":
        other = tokens.clone()
        other[:, -task.seq_len :] = torch.randint(0, task.d_vocab, (len(tokens), task.seq_len), generator=g)
        return other
    return task.sample(len(tokens), g)[0]


def source_writes(subject: Subject, graph: Graph, tokens, corruption: str, seed: int) -> dict:
    """The senders' ablated values for ``corruption``: their writes on ``other_contexts``, or (``mean``)
    those writes averaged over the held-out contexts."""
    writes = sender_writes(subject, graph, other_contexts(subject.task, tokens, corruption, seed))[0]
    return mean_writes(writes) if corruption == "mean" else writes


def _mask(graph: Graph, site: str, group: str, like: Tensor) -> Tensor:
    m = torch.zeros(like.shape[1], dtype=like.dtype, device=like.device)
    m[graph.groups[site][group]] = 1
    return m.view(1, -1, *([1] * (like.dim() - 2)))


def _batches(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class _Recorded(Exception):
    """Ends a forward pass once every activation it was run for is recorded."""


class Runner:
    """The base contexts ``tokens``, the senders' writes on them (``clean``) and their ablated values
    (``source``, each broadcastable to the clean write), and the metric of the ``targets`` (default
    ``tokens``): runs circuits and scores edges. Each forward pass runs the contexts repeated ``copies``
    times at most (about ``rows`` contexts in all), each copy with its own interventions."""

    def __init__(self, subject: Subject, graph: Graph, tokens, source: dict, metric: Metric = per_context_nll,
                 targets=None, rows: int = ROWS):  # fmt: skip
        self.subject, self.graph, self.tokens, self.source, self.metric = subject, graph, tokens, source, metric
        self.targets = tokens if targets is None else targets
        self.clean, lp = sender_writes(subject, graph, tokens)
        self.clean_values = metric(lp, self.targets)
        self.clean_metric = float(self.clean_values.mean())
        self.copies = max(1, rows // len(tokens))
        self.passes = self.context_runs = 0  # forward passes, and contexts x copies over them

    @torch.no_grad()
    def forward(self, copies: list[list[Intervention]], shared=(), record=()):
        """One forward pass over the contexts repeated once per entry of ``copies``: copy c carries the
        Interventions ``copies[c]`` on its own rows, every copy those of ``shared``. Returns the log-probs
        ``[copies * batch, H, d]``; with ``record`` (hook names), the activations there instead, the pass
        ending as soon as each has fired."""
        b, record = len(self.tokens), set(record)
        edits: dict = {}
        for c, ivs in enumerate(copies):
            for iv in [*ivs, *shared]:
                edits.setdefault(iv.hook, []).append((slice(c * b, (c + 1) * b), iv))
        recorded = {}

        def hook_fn(act, hook, name):
            if name in edits:
                act = act.clone()
                for rows, iv in edits[name]:
                    act[rows] = iv.apply(act[rows])
            if name in record:
                recorded[name] = act
                if len(recorded) == len(record):
                    raise _Recorded
            return act

        self.passes += 1
        self.context_runs += len(copies) * b
        hooks = [(name, partial(hook_fn, name=name)) for name in sorted({*edits, *record})]
        try:
            lp = self.subject.log_probs(self.tokens.repeat(len(copies), 1), hooks)
        except _Recorded:
            return recorded
        if record:
            raise ValueError(f"the forward pass never reached {', '.join(sorted(record - set(recorded)))}")
        return lp

    def values_of(self, lp: Tensor, copies: int) -> Float[Tensor, "copies batch"]:
        """The metric of each context in each copy of ``forward``'s log-probs."""
        return self.metric(lp, self.targets.repeat(copies, 1)).view(copies, len(self.tokens))

    def change(self, sender: str, site: str, now: dict, group: str | None = None) -> Tensor:
        """The sender's ablated write at ``site`` minus its write in ``now``, at ``group``'s positions (None:
        at every position)."""
        key = (sender, site)
        diff = self.source[key].to(now[key].dtype) - now[key]
        return diff if group is None else diff * _mask(self.graph, site, group, diff)

    def delta(self, r: Receiver, ablated: list[Edge], now: dict) -> Tensor:
        """What the receiver's input changes by when ``ablated`` edges into it carry their ablated value:
        the sum of each edge's ``change`` at its positions."""
        total = 0
        for e in ablated:
            total = total + self.change(e.sender, r.site, now, e.group)
        return total

    def run(self, ablated) -> float:
        """``run_values(ablated)`` averaged over contexts."""
        return float(self.run_values(ablated).mean())

    def run_values(self, ablated) -> Float[Tensor, " batch"]:
        """Per context, the metric of ``run_log_probs(ablated)``."""
        return self.metric(self.run_log_probs(ablated), self.targets)

    def run_log_probs(self, ablated) -> Tensor:
        """The log-probs with every edge of ``ablated`` ablated (its receiver sees the sender's ablated value)
        and everything else computed as the circuit computes it (ACDC's semantics: a kept edge carries the
        sender's value in this run, itself downstream of ablated edges). Level by level from the input:
        the senders' writes in this run so far (a pass that ends at the level's site), then each receiver's
        activation from its edited input (receivers with the same ablated edges share one copy of the
        contexts; the pass ends once they are recorded); a last pass runs with every one patched in."""
        by_receiver: dict = {}
        for e in ablated:
            by_receiver.setdefault(self.graph.receiver_of(e), []).append(e)
        b, patches, final, now = len(self.tokens), [], [], self.clean
        for level in sorted({r.level for r in by_receiver}):
            todo = [r for r in by_receiver if r.level == level]
            site = todo[0].site
            if patches:  # the senders' writes in this run so far
                senders = [s for s in self.graph.senders if s.level <= level and site in s.at]
                cache = self.forward([[]], patches, {s.at[site][0] for s in senders})
                now = {(s.node, site): s.write(cache, site) for s in senders}
            key = {r: frozenset((e.sender, e.group) for e in by_receiver[r]) for r in todo}
            deltas = {}
            for r in todo:
                if key[r] not in deltas:
                    deltas[key[r]] = self.delta(r, by_receiver[r], now)
            if todo[0].capture is None:  # the output: its input moved in the last pass
                final += [Intervention(site, "add", value=deltas[key[r]]) for r in todo]
                continue
            captures, acts = {r.capture for r in todo}, {}
            for part in _batches(list(deltas), self.copies):
                rec = self.forward([[Intervention(site, "add", value=deltas[k])] for k in part], patches, captures)
                acts.update({k: {c: rec[c][i * b : (i + 1) * b] for c in captures} for i, k in enumerate(part)})
            patches = patches + [Intervention(r.capture, "patch", heads=None if r.head is None else (r.head,),
                                              value=acts[key[r]][r.capture]) for r in todo]  # fmt: skip
        return self.forward([final], patches)

    def keep_only(self, kept) -> float:
        """The metric of the circuit ``kept`` (every other edge ablated)."""
        return float(self.keep_only_values(kept).mean())

    def keep_only_values(self, kept) -> Float[Tensor, " batch"]:
        kept = set(kept)
        return self.run_values([e for e in self.graph.edges if e not in kept])

    # Exact edge patching ------------------------------------------------------------------------------
    def exact_values(self, edges=None, progress=None) -> Float[Tensor, "edge batch"]:
        """Each edge ablated alone (the rest clean), per context: the metric's change. The edge's receiver
        is recomputed from its edited input in one pass and patched into the next. One edit serves every
        edge it can: a sender's change at a site, at every position, for every position-wise receiver
        reading that site (each patched at its edge's positions only); the copyers, which read every
        position, need one edit per group of positions. The same numbers as ``run_values([edge])`` edge
        by edge (a test checks it)."""
        edges = self.graph.edges if edges is None else list(edges)
        by_edit: dict = {}  # (sender, site, group or None for every position) -> the edges it serves; None: output
        for i, e in enumerate(edges):
            by_edit.setdefault(self._edit_of(e), []).append(i)
        out = torch.empty(len(edges), len(self.tokens), dtype=torch.float64)
        parts = _batches(list(by_edit), self.copies)
        for part in parts if progress is None else progress(parts):
            acts = self._edited([k for k in part if k is not None])
            for chunk in _batches([i for k in part for i in by_edit[k]], self.copies):
                lp = self.forward([[self._ablation(edges[i], acts)] for i in chunk])
                out[chunk] = self.values_of(lp, len(chunk)) - self.clean_values
        return out

    def _edit_of(self, e: Edge) -> tuple | None:
        r = self.graph.receiver_of(e)
        return None if r.capture is None else (e.sender, r.site, None if r.positionwise else e.group)

    def _edited(self, edits: list[tuple]) -> dict:
        """For each edit ``(sender, site, group)``, in one pass: the activations of the receivers reading
        ``site`` when the sender's write there carries its ablated value (at ``group``'s positions)."""
        if not edits:
            return {}
        b, sites = len(self.tokens), {site for _, site, _ in edits}
        captures = {r.capture for r in self.graph.receivers if r.capture and r.site in sites}
        rec = self.forward([[Intervention(site, "add", value=self.change(s, site, self.clean, g))]
                            for s, site, g in edits], record=captures)  # fmt: skip
        return {k: {c: rec[c][i * b : (i + 1) * b] for c in captures} for i, k in enumerate(edits)}

    def _ablation(self, e: Edge, acts: dict) -> Intervention:
        """Edge ``e`` ablated alone: its receiver's activation recomputed from its edited input (``acts``),
        at the edge's positions for a position-wise receiver; for the output, its input moved."""
        r = self.graph.receiver_of(e)
        if r.capture is None:
            return Intervention(r.site, "add", value=self.change(e.sender, r.site, self.clean, e.group))
        return Intervention(r.capture, "patch", heads=None if r.head is None else (r.head,),
                            positions=self.graph.groups[r.site][e.group] if r.positionwise else None,
                            value=acts[self._edit_of(e)][r.capture])  # fmt: skip

    # Attribution patching -----------------------------------------------------------------------------
    def input_grads(self, fwd_hooks=()) -> dict:
        """d metric / d (each receiver's input), ``{(node, input): [batch, pos, D]}``, at the run under
        ``fwd_hooks``: the gradient at the receiver's captured activation pulled back to its site. Each
        context's metric is differentiated with respect to its own inputs (their sum's gradient)."""
        sites, acts = {}, {}
        captures = {r.capture for r in self.graph.receivers if r.capture}

        def leaf(x, hook):
            return x.detach().requires_grad_(True)

        hooks = [*fwd_hooks]
        hooks += [(s, leaf) for s in ("hook_embed", "hook_pos_embed") if s in self.subject.model.hook_dict]
        hooks += [Intervention(s, "record", store=sites).fwd_hook() for s in {r.site for r in self.graph.receivers}]
        hooks += [Intervention(c, "record", store=acts).fwd_hook() for c in captures]
        with torch.enable_grad():
            lp = self.subject.log_probs(self.tokens, hooks)
            m = self.metric(lp, self.targets).sum()
            names = sorted(captures)
            final = [r.site for r in self.graph.receivers if r.capture is None]
            grads = torch.autograd.grad(m, [acts[c] for c in names] + [sites[s] for s in final], retain_graph=True,
                                        allow_unused=True)  # fmt: skip
            g_act = dict(zip(names, grads[: len(names)]))
            out = {}
            for r in self.graph.receivers:
                if r.capture is None:
                    out[(r.node, r.input)] = grads[len(names) + final.index(r.site)]
                    continue
                g = g_act[r.capture]
                if g is None:
                    out[(r.node, r.input)] = torch.zeros_like(sites[r.site])
                    continue
                a = acts[r.capture]
                if r.head is not None:
                    sel = torch.zeros_like(g)
                    sel[:, :, r.head] = g[:, :, r.head]
                    g = sel
                (pulled,) = torch.autograd.grad(a, sites[r.site], grad_outputs=g, retain_graph=True, allow_unused=True)
                out[(r.node, r.input)] = torch.zeros_like(sites[r.site]) if pulled is None else pulled
        self.passes += 1
        self.context_runs += len(self.tokens)
        return {k: v.detach() for k, v in out.items()}

    def _attribution(self, grads: dict, edges) -> Float[Tensor, "edge batch"]:
        """Per edge and context: the sender's change at the edge's positions times the gradient there."""
        out = []
        for e in edges:
            site = self.graph.receiver_of(e).site
            diff = self.change(e.sender, site, self.clean, e.group)
            out.append((diff.double() * grads[(e.receiver, e.input)].double()).flatten(1).sum(1))
        return torch.stack(out) if out else torch.empty(0, len(self.tokens), dtype=torch.float64)

    def eap_values(self, edges=None) -> Float[Tensor, "edge batch"]:
        """EAP, per context: ``(ablated - clean write) . d metric / d input`` at the clean run (first order in
        the change)."""
        edges = self.graph.edges if edges is None else edges
        return self._attribution(self.input_grads(), edges)

    def eap_ig_values(self, edges=None, steps: int = 8) -> Float[Tensor, "edge batch"]:
        """EAP-IG, per context: the gradient averaged over ``steps`` runs whose embeddings move from clean to
        ablated (midpoints ``(i + 1/2) / steps``), times the change: integrated gradients along the inputs."""
        edges = self.graph.edges if edges is None else edges
        embeds = [s for s in self.graph.senders if s.node in ("embed", "pos_embed")]
        total = None
        for i in range(steps):
            a = (i + 0.5) / steps
            hooks = []
            for s in embeds:
                hook = s.at[next(iter(s.at))][0]
                if hook not in ("hook_embed", "hook_pos_embed"):
                    continue
                site = next(k for k, v in s.at.items() if v[0] == hook)
                diff = self.source[(s.node, site)] - self.clean[(s.node, site)]
                hooks.append(Intervention(hook, "add", value=a * diff).fwd_hook())
            g = self.input_grads(hooks)
            total = g if total is None else {k: total[k] + g[k] for k in total}
        return self._attribution({k: v / steps for k, v in total.items()}, edges)

    def exact_scores(self, edges=None, progress=None) -> list[float]:
        """``exact_values`` averaged over contexts."""
        return self.exact_values(edges, progress).mean(1).tolist()

    def eap_scores(self, edges=None) -> list[float]:
        """``eap_values`` averaged over contexts."""
        return self.eap_values(edges).mean(1).tolist()

    def eap_ig_scores(self, edges=None, steps: int = 8) -> list[float]:
        """``eap_ig_values`` averaged over contexts."""
        return self.eap_ig_values(edges, steps).mean(1).tolist()


def denoising_runner(subject: Subject, graph: Graph, tokens, corruption: str, seed: int,
                     metric: Metric = per_context_nll) -> Runner:  # fmt: skip
    """The Runner of the denoising direction: the base run on ``other_contexts(tokens)``, the senders'
    values to restore their writes on ``tokens``, the metric that of ``tokens``' targets."""
    if corruption == "mean":
        raise ValueError("denoising needs a corruption that is a run on other contexts, not 'mean'")
    other = other_contexts(subject.task, tokens, corruption, seed)
    return Runner(subject, graph, other, sender_writes(subject, graph, tokens)[0], metric, targets=tokens)


# Node ablation: a circuit of nodes, everything outside it ablated --------------------------------------
NODE_ABLATIONS = {
    "mean": "its mean over held-out contexts, position by position",
    "resample": "its value on a fresh context of the task, context by context",
}


def node_outputs(subject: Subject, graph: Graph) -> dict[str, tuple[str, int | None]]:
    """Each head and MLP of ``graph`` -> (the hook of its output, its head index or None): ``hook_z`` of
    its layer for a head, ``hook_mlp_out`` for an MLP."""
    out = {}
    for n in graph.nodes(graph.edges):
        if n.startswith("MLP"):
            out[n] = (f"blocks.{n[3:]}.hook_mlp_out", None)
        else:
            layer, head = n[1:].split("H")
            out[n] = (subject.head_output(int(layer)), int(head))
    _check_hooks(subject, sorted({h for h, _ in out.values()}))
    return out


def record_outputs(subject: Subject, tokens, hooks_: list[str], rows: int = ROWS) -> dict:
    """The activations at ``hooks_`` on ``tokens``, ``{hook: [batch, ...]}``, ``rows`` contexts a pass."""
    parts: list[dict] = []
    for i in range(0, len(tokens), rows):
        store: dict = {}
        with torch.no_grad():
            subject.log_probs(tokens[i : i + rows], [Intervention(h, "record", store=store).fwd_hook() for h in hooks_])
        parts.append({h: store[h].detach() for h in hooks_})
    return {h: torch.cat([p[h] for p in parts]) for h in hooks_}


def node_ablated_values(subject: Subject, graph: Graph, tokens, kept, ablation: str, reference,
                        metric: Metric = per_context_nll, rows: int = ROWS, recorded: dict | None = None,
                        positions=None) -> Float[Tensor, " batch"]:  # fmt: skip
    """Per context, the metric with every head and MLP NOT in ``kept`` ablated at every position: set to
    its mean over the ``reference`` contexts (``mean``) or, context by context, to its value on
    ``reference[i]`` (``resample``: as many as ``tokens``). The embeddings and the output are never
    ablated. ``kept`` may name nodes outside the graph's heads and MLPs (ignored). ``recorded``: the
    outputs on ``reference`` recorded already (``record_outputs``), to spare that pass. ``positions``: ablate
    there only (default: every position)."""
    if ablation not in NODE_ABLATIONS:
        raise ValueError(f"unknown node ablation {ablation!r}; expected one of {', '.join(NODE_ABLATIONS)}")
    if ablation == "resample" and len(reference) != len(tokens):
        raise ValueError(f"resample ablation pairs contexts: {len(reference)} reference contexts for {len(tokens)}")
    outputs, kept = node_outputs(subject, graph), set(kept)
    by_hook: dict = {}
    for n, (hook, head) in outputs.items():
        if n not in kept:
            by_hook.setdefault(hook, []).append(head)
    ref = recorded if recorded is not None else record_outputs(subject, reference, sorted(by_hook), rows)
    values = []
    for i in range(0, len(tokens), rows):
        part = slice(i, i + rows)
        ivs = []
        for hook, heads in by_hook.items():
            index = None if heads == [None] else tuple(heads)
            if ablation == "mean":
                ivs.append(Intervention(hook, "mean", heads=index, positions=positions, value=ref[hook].mean(0)))
            else:
                ivs.append(Intervention(hook, "patch", heads=index, positions=positions, value=ref[hook][part]))
        with torch.no_grad():
            lp = subject.log_probs(tokens[part], [iv.fwd_hook() for iv in ivs])
        values.append(metric(lp, tokens[part]))
    return torch.cat(values)


def node_costs(subject: Subject, graph: Graph, tokens, reference, metric: Metric = per_context_nll,
               rows: int = ROWS, nodes=None, positions=None) -> dict[str, Float[Tensor, " batch"]]:  # fmt: skip
    """Per head and MLP (or those of ``nodes``), per context: the metric's change when that node alone is
    mean-ablated (its mean over ``reference``; at ``positions`` only, if given), the rest clean."""
    with torch.no_grad():
        clean = torch.cat([metric(subject.log_probs(tokens[i : i + rows]), tokens[i : i + rows])
                           for i in range(0, len(tokens), rows)])  # fmt: skip
    outputs = node_outputs(subject, graph)
    recorded = record_outputs(subject, reference, sorted({h for h, _ in outputs.values()}), rows)
    return {n: node_ablated_values(subject, graph, tokens, [m for m in outputs if m != n], "mean", reference, metric,
                                   rows, recorded, positions) - clean for n in (outputs if nodes is None else nodes)}  # fmt: skip


def roc_auc(scores, truth) -> float:
    """ROC AUC of ``scores`` (higher: more likely an edge) against booleans ``truth``; ties count half."""
    pos = [s for s, t in zip(scores, truth) if t]
    neg = [s for s, t in zip(scores, truth) if not t]
    if not pos or not neg:
        raise ValueError(f"ROC AUC needs true and false edges, got {len(pos)} true and {len(neg)} false")
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def ratio_se(a: Float[Tensor, " n"], b: Float[Tensor, " n"]) -> tuple[float, float]:
    """``mean(a) / mean(b)`` and its standard error over the n contexts: the delta method on the pairs
    ``(a_i, b_i)`` of one context each, so the denominator's variance and its covariance with the numerator
    count (it equals a bootstrap over contexts; a test checks it)."""
    a, b = a.double(), b.double()
    r = a.mean() / b.mean()
    se = ((a - r * b).std() / (len(a) ** 0.5) / b.mean().abs()).item() if len(a) > 1 else float("nan")
    return r.item(), se


def mean_se(x: Float[Tensor, " n"]) -> tuple[float, float]:
    x = x.double()
    return x.mean().item(), (x.std() / len(x) ** 0.5).item() if len(x) > 1 else float("nan")


# Search -------------------------------------------------------------------------------------------------
def top_n(edges, scores, n: int) -> list[Edge]:
    """The ``n`` edges of largest |score|."""
    order = sorted(range(len(edges)), key=lambda i: -abs(scores[i]))
    return [edges[i] for i in order[:n]]


def curve_sizes(n_total: int, points: int) -> list[int]:
    """Circuit sizes along a faithfulness curve: 0, then ``points`` sizes spaced geometrically up to every edge."""
    sizes = {0, n_total}
    for i in range(1, points + 1):
        sizes.add(max(1, round(n_total ** (i / points))))
    return sorted(sizes)


def threshold(edges, scores, tau: float) -> list[Edge]:
    """The edges with |score| >= ``tau``."""
    return [e for e, s in zip(edges, scores) if abs(s) >= tau]


def greedy(runner: Runner, tau: float, order=None) -> list[Edge]:
    """ACDC-style pruning: from the full graph, visit receivers from the output backwards and remove each
    edge whose removal (with those already removed) moves the metric by less than ``tau``."""
    removed: list[Edge] = []
    current = runner.clean_metric
    levels = {(r.node, r.input): r.level for r in runner.graph.receivers}
    edges = order or sorted(runner.graph.edges, key=lambda e: -levels[(e.receiver, e.input)])
    for e in edges:
        value = runner.run(removed + [e])
        if abs(value - current) < tau:
            removed.append(e)
            current = value
    return [e for e in runner.graph.edges if e not in set(removed)]
