"""The graph circuit discovery works on: its senders, receivers and edges, built for a subject
(``build_graph``; the package docstring says what the nodes and edges are)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import Tensor

from models.interp.subject import DISENTANGLED, Subject, head_label
from models.plumbing.io import UsageError

INPUTS = ("q", "k", "v")
ENDS = ("embed", "pos_embed", "output")  # the nodes that are neither a head nor an MLP (never ablated as nodes)


@dataclass(frozen=True, eq=False)
class Node:
    """A node of the graph: ``kind`` is ``head`` (with its ``layer`` and ``head``), ``mlp`` (with its
    ``layer``), or one of ``ENDS`` (``embed``, ``pos_embed``, ``output``). ``str(node)`` is its label, as the
    JSON and TransformerLens write it: ``L1H2``, ``MLP0``, ``embed``; ``Node.parse`` reads a label back. A
    node equals (and hashes as) its label, so ``Node.parse("L1H2") == "L1H2"`` and either finds the other
    in a set or a dict."""

    kind: str
    layer: int | None = None
    head: int | None = None

    LABEL = re.compile(r"L(\d+)H(\d+)|MLP(\d+)")

    def __post_init__(self):
        shape = {"head": (True, True), "mlp": (True, False), **{e: (False, False) for e in ENDS}}
        if self.kind not in shape or shape[self.kind] != (self.layer is not None, self.head is not None):
            raise ValueError(f"no node of kind {self.kind!r} with layer {self.layer} and head {self.head}; "
                             f"kinds: head (layer, head), mlp (layer), {', '.join(ENDS)}")  # fmt: skip
        label = head_label(self.layer, self.head) if self.kind == "head" else (
            f"MLP{self.layer}" if self.kind == "mlp" else self.kind)  # fmt: skip
        object.__setattr__(self, "_label", label)  # made once: a big graph compares and hashes nodes millions of times
        object.__setattr__(self, "_hash", hash(label))

    @classmethod
    def parse(cls, label: str) -> Node:
        """``L1H2`` -> the head 2 of layer 1; ``MLP0``; ``embed``, ``pos_embed``, ``output``. ValueError
        naming the label otherwise."""
        if isinstance(label, Node):
            return label
        if label in ENDS:
            return cls(label)
        m = cls.LABEL.fullmatch(str(label))
        if m is None:
            raise ValueError(f"no node {label!r}: expected a head (L1H2), an MLP (MLP0), or one of {', '.join(ENDS)}")
        return cls("head", int(m[1]), int(m[2])) if m[1] is not None else cls("mlp", int(m[3]))

    @property
    def is_end(self) -> bool:
        """The embeddings and the output: neither a head nor an MLP."""
        return self.kind in ENDS

    def __str__(self) -> str:
        return self._label

    def __repr__(self) -> str:
        return f"Node({str(self)!r})"

    def __eq__(self, other) -> bool:
        if isinstance(other, Node):
            return self._label == other._label
        return self._label == other if isinstance(other, str) else NotImplemented

    def __hash__(self) -> int:
        return self._hash


@dataclass(frozen=True)
class Edge:
    """Sender ``sender`` into input ``input`` (q, k, v; ``in`` of an MLP; ``out`` of the output) of node
    ``receiver`` at the positions of group ``group``. Labels given for the nodes are parsed (``Node.parse``)."""

    sender: Node
    receiver: Node
    input: str
    group: str

    def __post_init__(self):
        object.__setattr__(self, "sender", Node.parse(self.sender))
        object.__setattr__(self, "receiver", Node.parse(self.receiver))

    @property
    def label(self) -> str:
        return f"{self.sender}->{self.receiver}.{self.input}@{self.group}"

    def to_dict(self) -> dict:
        return {"sender": str(self.sender), "receiver": str(self.receiver), "input": self.input, "group": self.group}


@dataclass(frozen=True)
class Receiver:
    """One input of one node: ``site`` is the residual it reads, ``capture`` (with ``head``) the activation
    it computes from it (None: the output, read from ``site`` itself). ``level`` orders receivers: every
    receiver of a level reads senders of lower levels only, and the receivers of a level share one site.
    ``positionwise``: the activation at a position reads the site at that position only (a head's q, k, v
    and an MLP; not the content-free copyers, which read every position)."""

    node: Node
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

    node: Node
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
                raise RuntimeError(f"receivers of level {r.level} read two sites, {sites[r.level]} and {r.site}")

    def sender(self, node: Node | str) -> Sender:
        return next(s for s in self.senders if s.node == node)

    def receiver(self, node: Node | str, input: str) -> Receiver:
        return self._receivers[(node, input)]

    def receiver_of(self, edge: Edge) -> Receiver:
        return self._receivers[(edge.receiver, edge.input)]

    @property
    def sender_hooks(self) -> list[str]:
        return sorted({h for s in self.senders for h, _, _ in s.at.values()})

    def nodes(self, edges) -> list[Node]:
        """Heads and MLPs that some edge of ``edges`` enters or leaves (embeddings and the output apart)."""
        names = {e.sender for e in edges} | {e.receiver for e in edges}
        return [n for n in self.node_order if n in names and not n.is_end]

    @property
    def node_order(self) -> list[Node]:
        return list(dict.fromkeys([s.node for s in self.senders] + [r.node for r in self.receivers]))

    def find(self, label: str) -> Edge:
        for e in self.edges:
            if e.label == label:
                return e
        raise ValueError(f"no edge {label!r} in this graph; edges look like {self.edges[0].label!r}")


def check_hooks(subject: Subject, names) -> None:
    missing = [n for n in names if n not in subject.model.hook_dict]
    if missing:
        raise UsageError(
            f"--checkpoint {subject.name}: circuit discovery needs the hooks {', '.join(missing[:4])}"
            f"{' ...' if len(missing) > 4 else ''}, which this model has not (a {subject.describe()})"
        )


def build_graph(subject: Subject) -> Graph:
    """The graph of ``subject`` (see the package docstring); ValueError if it lacks a hook the graph uses."""
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
    check_hooks(subject, ["hook_embed", site0, res0, site1, out, "blocks.0.attn.hook_z",
                           *(f"blocks.1.attn.hook_{x}" for x in INPUTS)])  # fmt: skip
    senders = [Sender(Node("embed"), 0, {site0: ("hook_embed", None, None), site1: (res0, None, (0, d))})]
    senders += [Sender(Node("head", 0, k), 1, {site1: (res0, None, ((k + 1) * d, (k + 2) * d))}) for k in range(K)]
    senders += [Sender(Node("head", 1, 0), 2, {out: (out, None, None)})]
    receivers = [Receiver(Node("head", 0, k), "v", site0, "blocks.0.attn.hook_z", k, 0, positionwise=False)
                 for k in range(K)]  # fmt: skip
    receivers += [Receiver(Node("head", 1, 0), x, site1, f"blocks.1.attn.hook_{x}", 0, 1) for x in INPUTS]
    receivers += [Receiver(Node("output"), "out", out, None, None, 2)]
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
    check_hooks(subject, need)
    if not all(hasattr(model.blocks[i].attn, "W_O") for i in range(n)):
        raise UsageError(f"--checkpoint {subject.name}: circuit discovery needs each layer's attn.W_O")
    layout = subject.layout
    final = f"blocks.{n - 1}.hook_resid_post"
    sites = [f"blocks.{i}.hook_resid_pre" for i in range(n)] + [f"blocks.{i}.hook_resid_mid" for i in range(n)]
    sites.append(final)

    def everywhere(hook, head=None):
        return {s: (hook, head, None) for s in sites}

    senders = [Sender(Node("embed"), 0, everywhere("hook_embed"))]
    if "hook_pos_embed" in model.hook_dict:
        senders.append(Sender(Node("pos_embed"), 0, everywhere("hook_pos_embed")))
    receivers = []
    for i in range(n):
        W_O = model.blocks[i].attn.W_O.detach()
        for j in range(subject.n_heads[i]):
            receivers += [Receiver(Node("head", i, j), x, f"blocks.{i}.hook_resid_pre", f"blocks.{i}.attn.hook_{x}",
                                   j, 2 * i) for x in INPUTS]  # fmt: skip
            senders.append(Sender(Node("head", i, j), 2 * i + 1, everywhere(f"blocks.{i}.attn.hook_z", j), W_O))
        if has_mlp[i]:
            receivers.append(Receiver(Node("mlp", i), "in", f"blocks.{i}.hook_resid_mid", f"blocks.{i}.hook_mlp_out",
                                      None, 2 * i + 1))  # fmt: skip
            senders.append(Sender(Node("mlp", i), 2 * i + 2, everywhere(f"blocks.{i}.hook_mlp_out")))
    receivers.append(Receiver(Node("output"), "out", final, None, None, 2 * n))
    # A head of layer i reads resid_pre i (senders of levels <= 2i); layer i's MLP also reads its heads.
    keys = layout.key_tokens()  # [T, 2]: (l, h) of each position's task token, (-1, -1) for none
    L = subject.task.n_examples
    role = {"demonstrations": (keys[:, 0] >= 0) & (keys[:, 0] < L), "target": keys[:, 0] == L, "other": keys[:, 0] < 0}
    by_role = {g: torch.nonzero(m).flatten().tolist() for g, m in role.items() if m.any()}
    groups = {s: by_role for s in sites}
    return Graph(senders, receivers, groups, _edges(senders, receivers, groups), "standard")
