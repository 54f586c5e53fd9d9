"""The forward pass every method shares: ``Runner`` runs the model on its base contexts with edges ablated
(a receiver sees its sender's ablated value), given the senders' writes and their ablated values (which
``corruptions`` makes). The scoring methods (``exact``, ``attribution``) and the searches (``scores``,
``search``) drive a Runner; node ablation (``nodes``) runs the model itself."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from jaxtyping import Float
from torch import Tensor

from models.interp.circuit.graph import Edge, Graph, Receiver
from models.interp.interventions import Intervention
from models.interp.subject import Subject
from probes.metrics import per_context_nll

Metric = Callable[[Tensor, Tensor], Tensor]  # (log_probs [batch, H, d], tokens [batch, T]) -> each context's [batch]
ROWS = 512  # contexts x copies per forward pass: much larger batches spend their time faulting in fresh memory


def sender_writes(subject: Subject, graph: Graph, tokens, fwd_hooks=(), keep=None) -> tuple[dict, Tensor]:
    """Every sender's write at every site it reaches, ``{(node, site): [batch, pos, D]}``, and the log-probs.
    A write that is the same at several sites (a standard model's head, read by every later layer) is one
    tensor, so that memory grows with the senders, not with senders times sites. ``keep``: the writes of
    these nodes only (a big model's every head's write is gigabytes)."""
    cache: dict = {}
    senders = [s for s in graph.senders if keep is None or s.node in keep]
    wanted = {s.at[site][0] for s in senders for site in s.at}
    hooks = [*fwd_hooks, *(Intervention(h, "record", store=cache).fwd_hook() for h in graph.sender_hooks if h in wanted)]
    with torch.no_grad():
        lp = subject.log_probs(tokens, hooks)
    made: dict = {}
    for s in senders:
        for site in s.at:
            where = (s.node, s.at[site][0], s.at[site][1], s.at[site][2])
            if where not in made:
                made[where] = s.write(cache, site)
    return {(s.node, site): made[(s.node, *s.at[site])] for s in senders for site in s.at}, lp


def mean_writes(writes: dict) -> dict:
    """Each write averaged over contexts (``[1, pos, D]``): the values of mean ablation. Summed in float64, so
    that a write the same on every context (the position embedding) is its own mean exactly: its change is
    exactly zero, not float rounding whose tiny standard error would rank it among the real edges."""
    means: dict = {}  # by tensor: a write shared by several sites has one mean
    for v in writes.values():
        if id(v) not in means:
            means[id(v)] = v.double().mean(0, keepdim=True).to(v.dtype)
    return {k: means[id(v)] for k, v in writes.items()}


def _mask(graph: Graph, site: str, group: str, like: Tensor) -> Tensor:
    m = torch.zeros(like.shape[1], dtype=like.dtype, device=like.device)
    m[graph.groups[site][group]] = 1
    return m.view(1, -1, *([1] * (like.dim() - 2)))


def batches(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class _Recorded(Exception):
    """Ends a forward pass once every activation it was run for is recorded."""


@torch.no_grad()
def run_copies(subject: Subject, tokens, copies: list[list[Intervention]], shared=(), record=()):
    """One forward pass over ``tokens`` ``[batch, T]`` repeated once per entry of ``copies``: copy c carries
    the Interventions ``copies[c]`` on its own rows, every copy those of ``shared``. Returns the log-probs
    ``[copies * batch, H, d]``; with ``record`` (hook names), the activations there instead, the pass
    ending as soon as each has fired."""
    b, record = len(tokens), set(record)
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

    hooks = [(name, partial(hook_fn, name=name)) for name in sorted({*edits, *record})]
    try:
        lp = subject.log_probs(tokens.repeat(len(copies), 1), hooks)
    except _Recorded:
        return recorded
    if record:
        raise RuntimeError(f"the forward pass never reached {', '.join(sorted(record - set(recorded)))}")
    return lp


class Runner:
    """The base contexts ``tokens`` ``[batch, T]``, the senders' writes on them (``clean``, ``{(node, site):
    [batch, pos, D]}``) and their ablated values (``source``, each broadcastable to the clean write), and
    the metric of the ``targets`` (default ``tokens``; ``clean_values`` ``[batch]`` on the unablated run):
    runs the model with edges ablated. The scores are functions of a Runner (``exact.exact_scores``,
    ``attribution.eap_scores``, ``attribution.eap_ig_scores``). Each forward pass runs the contexts repeated
    ``copies`` times at most (about ``rows`` contexts in all), each copy with its own interventions;
    ``passes`` and ``context_runs`` count them. ``clean``: ``sender_writes(subject, graph, tokens)`` when the
    caller has it already (runners of several corruptions on the same contexts share one clean pass). ``base``:
    Interventions made in every pass (each copy), the clean one included: a Runner on a sub-graph whose
    outside is held at its ablated values (``discovery``'s edges pruned inside a circuit of nodes)."""

    def __init__(self, subject: Subject, graph: Graph, tokens, source: dict, metric: Metric = per_context_nll,
                 targets=None, rows: int = ROWS, clean: tuple[dict, Tensor] | None = None,
                 base: list[Intervention] = ()):  # fmt: skip
        self.subject, self.graph, self.tokens, self.source, self.metric = subject, graph, tokens, source, metric
        self.targets = tokens if targets is None else targets
        self.base = list(base)  # in every pass, the clean one too: a circuit of nodes' outside at its ablated values
        hooks = [iv.fwd_hook() for iv in self.base]
        self.clean, lp = sender_writes(subject, graph, tokens, hooks) if clean is None else clean
        self.clean_values = metric(lp, self.targets)
        self.clean_metric = float(self.clean_values.mean())
        self.copies = max(1, rows // len(tokens))
        self.passes = self.context_runs = 0  # forward passes, and contexts x copies over them

    def forward(self, copies: list[list[Intervention]], shared=(), record=()):
        """``run_copies`` on the base contexts, counted in ``passes`` and ``context_runs``."""
        self.passes += 1
        self.context_runs += len(copies) * len(self.tokens)
        return run_copies(self.subject, self.tokens, copies, [*self.base, *shared], record)

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
        contexts; the pass ends once they are recorded); a last pass runs with every one patched in.
        A node none of whose out-edges is kept needs no such step: every receiver sees its ablated value,
        whatever it computes in this run, so its own inputs are left as the run has them."""
        gone, by_receiver = set(ablated), {}
        live = {e.sender for e in self.graph.edges if e not in gone}
        for e in ablated:
            r = self.graph.receiver_of(e)
            if r.capture is None or r.node in live:
                by_receiver.setdefault(r, []).append(e)
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
            for part in batches(list(deltas), self.copies):
                rec = self.forward([[Intervention(site, "add", value=deltas[k])] for k in part], patches, captures)
                acts.update({k: {c: rec[c][i * b : (i + 1) * b] for c in captures} for i, k in enumerate(part)})
            patches = patches + [Intervention(r.capture, "patch", heads=None if r.head is None else (r.head,),
                                              value=acts[key[r]][r.capture]) for r in todo]  # fmt: skip
        return self.forward([final], patches)

    def keep_only(self, kept) -> float:
        """The metric of the circuit ``kept`` (every other edge ablated)."""
        return float(self.keep_only_values(kept).mean())

    def keep_only_values(self, kept) -> Float[Tensor, " batch"]:
        """Per context, the metric of the circuit ``kept`` (every other edge ablated)."""
        kept = set(kept)
        return self.run_values([e for e in self.graph.edges if e not in kept])
