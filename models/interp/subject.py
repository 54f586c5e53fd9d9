"""The model under study, as every analysis sees it.

A ``Subject`` holds a hooked model, the task it was trained on and the ``Layout`` of its input ids, and
answers the questions analyses ask of any model family:

- ``log_probs(tokens, fwd_hooks)``: the target's log-probabilities ``[batch, H, d]`` (row 0: the root),
  the quantity BMA predicts, under optional TransformerLens forward hooks; a model with an unembedding
  computes the logits of the task's d ids alone, at the positions read (``task_logits``), so that its memory
  and work grow with the task, not with the vocabulary;
- ``attention(tokens)``: per layer, every head's pattern with each query labelled by the task token it
  predicts and each key by the task token it reads (``LayerAttention``); ``log_probs_and_attention``: both,
  from one pass;
- ``n_heads``, ``head_labels()``, ``head_output(layer)``: its heads by layer, with the hook name of each
  layer's per-head outputs (``hook_z``), for ablation and patching (``models.interp.interventions``);
- ``capabilities``: what this family has beyond that (the bilinear ``W_KQ``, a content-free copyer
  layer, ...). Analyses that need one declare it and refuse other families with one line.

Which heads copy which demonstration, or select parents, is measured from ``attention`` (``probes.roles``),
never assumed from the family. Families: ``DisentangledSubject`` (``CausalTransformer``, the Theorem 1
construction included) and ``StandardSubject`` (any decoder-only LM with TransformerLens hook names that
maps input ids to logits: a ``TransformerBridge`` over Hugging Face weights, ``models.nets.hooked_transformer``;
Edelman et al.'s ``models.nets.edelman`` too), ``CatFormerSubject`` (Nichani et al.'s ``models.nets.catformer``,
whose bilinear ``A`` blocks block_structure reads) and ``ChenSubject`` (Chen et al.'s ``models.nets.chen``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Float, Int
from torch import Tensor

from models.interp.capabilities import BAYES_TASK, BILINEAR, CONTENT_FREE_COPYERS, DISENTANGLED, MARKOV_TASK
from models.loading.sources import resolve
from models.nets.catformer import CatFormer
from models.nets.causal_transformer import CausalTransformer
from models.nets.chen import ChenTransformer
from models.nets.dtypes import dtype_name
from models.plumbing.io import UsageError
from probes import MarkovTreeTask, check_tokens, oracles
from probes.graph_task import GraphTask
from probes.layout import Layout


def check_finite(out: Tensor, what: str) -> Tensor:
    """``out``, the output of a forward pass of the model ``what``, if it holds no NaN and no +Inf (a
    log-probability of -Inf is a probability of 0, which a model may give); else one ``ValueError``:
    a NaN would become a NaN metric reported with exit code 0."""
    bad = torch.isnan(out) | torch.isposinf(out)
    if bad.any():
        rows = bad.flatten(1).any(1) if bad.ndim > 1 else bad
        raise UsageError(
            f"{what}: the forward pass gave NaN or Inf on {int(rows.sum())} of {len(rows)} contexts "
            f"({int(bad.sum())} of {bad.numel()} values): its weights or config overflow (e.g. an attn_scale "
            f"near 0, a huge beta or weights); no metric is computed from it"
        )
    return out


def has_bayes(task) -> bool:
    """Whether ``task`` has an exact Bayes oracle (``probes.oracles.check_bayes``): ours and the family's, except
    roots drawn from each context's own stationary distribution and random trees too long to sum over."""
    if not isinstance(task, MarkovTreeTask | GraphTask):
        return False
    try:
        oracles.check_bayes(task)
    except ValueError:
        return False
    return True


def head_label(layer: int, head: int) -> str:
    """TransformerLens-style head name, ``L0H3``."""
    return f"L{layer}H{head}"


@dataclass
class LayerAttention:
    """One layer's attention: ``pattern[b, head, q, k]``, with ``query_predicts[q] = (l, h)``, the task
    token whose prediction query row q feeds ((-1, -1): none), and ``key_token[k] = (l, h)``, the task
    token at key k ((-1, -1): BOS or a separator)."""

    pattern: Float[Tensor, "batch head Q K"]
    query_predicts: Int[Tensor, "Q 2"]
    key_token: Int[Tensor, "K 2"]

    def target_rows(self, n_examples: int, seq_len: int) -> Float[Tensor, "batch head H LplusOneH"]:
        """Attention from the query that predicts target token x_h, over the task's flat keys
        ``l * H + h'`` (keys that hold no task token dropped; keys a layer cannot see are 0)."""
        L, H = n_examples, seq_len
        rows = torch.full((H,), -1, dtype=torch.long)
        is_target = self.query_predicts[:, 0] == L
        rows[self.query_predicts[is_target, 1]] = torch.nonzero(is_target).flatten()
        if (rows[1:] < 0).any():  # x_0 may have none (a lone target without BOS): it has no parent to attend to
            raise ValueError(
                f"this layer has no query predicting target positions {torch.nonzero(rows < 0).flatten().tolist()}"
            )
        picked = self.pattern[:, :, rows.clamp_min(0).to(self.pattern.device)].double()
        picked[:, :, rows < 0] = 0
        keep = self.key_token[:, 0] >= 0
        flat = self.key_token[keep, 0] * H + self.key_token[keep, 1]
        out = picked.new_zeros(*picked.shape[:3], (L + 1) * H)
        out[..., flat.to(out.device)] = picked[..., keep.to(picked.device)]
        return out


class Subject:
    """The model under study, as every analysis sees it (module docstring); ``models.load_subject`` makes one.
    Subclasses set ``family``, ``n_heads``, ``capabilities``.

    Attributes:
        model: the hooked model (TransformerLens hook names).
        task: the task it was trained on (``probes.MarkovTreeTask``, a ``probes.GraphTask``, ...).
        layout: where its input ids hold the task's tokens (``probes.Layout``).
        name: the ``--checkpoint`` it was loaded from.
        hash: a digest of its weights (recorded in every analysis's JSON).
        family: ``"disentangled"``, ``"standard"``, ...
        n_heads: the number of heads of each layer.
        capabilities: what this family has beyond the common interface (``DISENTANGLED``, ``BILINEAR``, ...).
    """

    family: str = "?"
    capabilities: frozenset[str] = frozenset()

    def __init__(self, model, task, layout: Layout, name: str, digest: str):
        self.model, self.task, self.layout, self.name, self.hash = model, task, layout, name, digest
        self.n_heads: list[int] = []
        # the target positions its training loss used (models.loading.sources.files.POSITIONS): "all" (every next
        # token) or "last" (the last token only); what the analyses average NLL and progress over unless told
        self.trained_on = "all"

    def scored_positions(self, chosen: str | None = None) -> str:
        """The target positions an analysis averages over: ``chosen`` ("all" or "last"), or, for None or
        "trained", those its training loss used (``trained_on``)."""
        if chosen not in (None, "trained", "all", "last"):
            raise ValueError(f"positions must be one of trained, all, last; got {chosen!r}")
        return self.trained_on if chosen in (None, "trained") else chosen

    @property
    def device(self):
        """Where the model's weights are (``torch.device``)."""
        return self.model.cfg.device

    @property
    def n_layers(self) -> int:
        """The number of layers."""
        return len(self.n_heads)

    def head_labels(self) -> list[str]:
        """Every head's TransformerLens-style name, layer by layer: ``["L0H0", "L0H1", ..., "L1H0"]``."""
        return [head_label(i, j) for i, n in enumerate(self.n_heads) for j in range(n)]

    def head_output(self, layer: int) -> str:
        """Hook name of layer ``layer``'s per-head outputs, ``[batch, pos, head, d_head]``: what ablation and
        patching replace (``models.interp.interventions``).

        Args:
            layer: the layer, from 0.
        """
        return f"blocks.{layer}.attn.hook_z"

    def pattern_hook(self, layer: int) -> str:
        """Hook name of layer ``layer``'s attention pattern, ``[batch, head, query_pos, key_pos]``.

        Args:
            layer: the layer, from 0.
        """
        return f"blocks.{layer}.attn.hook_pattern"

    def describe(self) -> str:
        """One line: the family, the layers and the heads, e.g. ``standard model (2 layers, 8 + 8 heads)``."""
        heads = " + ".join(str(n) for n in self.n_heads)
        return f"{self.family} model ({self.n_layers} layers, {heads} heads)"

    def log_probs(self, tokens: Int[Tensor, "batch n_tokens"], fwd_hooks=()) -> Float[Tensor, "batch H d"]:
        """The forward pass every analysis reads, checked: a NaN or +Inf is one ``ValueError``, never a metric.

        Args:
            tokens: task tokens ``[batch, (L+1)*H]``, example-major (``subject.task.sample``); the subject maps
                them to its own input ids through its layout.
            fwd_hooks (Sequence[tuple[str, Callable]]): TransformerLens forward hooks, ``(hook_name, function)``
                pairs, attached for this pass only (an intervention: ``models.interp.interventions``).

        Returns:
            ``[batch, H, d]`` (float64): the log-probabilities of every target token x_h given the
            demonstrations and ``x_<h`` (row 0: the root), over the task's d tokens.

        Raises:
            ValueError: tokens that are not the task's (an id outside [0, d), a shape other than
                ``[batch, (L+1)*H]``), or a forward pass that gave NaN or +Inf.
        """
        task = self.task
        tokens = check_tokens(tokens, task.d_vocab, task.n_examples, task.seq_len)  # every family: ids and shape
        return check_finite(self._log_probs(tokens, fwd_hooks), f"--checkpoint {self.name}")

    def _log_probs(self, tokens, fwd_hooks) -> Float[Tensor, "batch H d"]:
        raise NotImplementedError

    def attention(self, tokens: Int[Tensor, "batch n_tokens"], fwd_hooks=()) -> list[LayerAttention]:
        """Every layer's attention with each query labelled by the task token it predicts and each key by the task
        token it reads, so an analysis asks "how much does the query predicting x_h put on its parent" without
        knowing the layout.

        Args:
            tokens: task tokens ``[batch, (L+1)*H]``, example-major.
            fwd_hooks (Sequence[tuple[str, Callable]]): TransformerLens forward hooks for this pass only.

        Returns:
            One ``LayerAttention`` per layer (``pattern`` ``[batch, head, Q, K]``, float64, and the labels);
            ``target_rows(L, H)`` gives the rows of the queries that predict the target's tokens.
        """
        return self.log_probs_and_attention(tokens, fwd_hooks)[1]

    def log_probs_and_attention(self, tokens: Int[Tensor, "batch n_tokens"], fwd_hooks=()
                                ) -> tuple[Float[Tensor, "batch H d"], list[LayerAttention]]:  # fmt: skip
        """``log_probs`` and ``attention`` of one forward pass (one pass where an analysis needs both)."""
        raise NotImplementedError

    def _run_capturing(self, tokens, fwd_hooks, layers) -> tuple[Tensor, dict[int, Tensor]]:
        """``log_probs`` with each listed layer's pattern captured (float64)."""
        store: dict[int, Tensor] = {}

        def grab(pattern, hook, layer):
            store[layer] = pattern.detach().double()

        hooks = [*fwd_hooks, *((self.pattern_hook(i), lambda p, hook, i=i: grab(p, hook, i)) for i in layers)]
        return self.log_probs(tokens, hooks), store


class DisentangledSubject(Subject):
    """The disentangled two-layer model (``CausalTransformer``): queries at the H target rows."""

    family = "disentangled"

    def __init__(self, model: CausalTransformer, task, name: str, digest: str):
        super().__init__(model, task, Layout(task.n_examples, task.seq_len, task.d_vocab), name, digest)
        self.n_heads = [model.cfg.n_copy_heads, 1]
        caps = {DISENTANGLED, CONTENT_FREE_COPYERS, BILINEAR}
        if isinstance(task, MarkovTreeTask):
            caps.add(MARKOV_TASK)
        if has_bayes(task):
            caps.add(BAYES_TASK)
        self.capabilities = frozenset(caps)

    def _log_probs(self, tokens, fwd_hooks):
        with self.model.hooks(fwd_hooks=list(fwd_hooks)):
            return self.model(tokens).double()

    def log_probs_and_attention(self, tokens, fwd_hooks=()):
        L, H = self.task.n_examples, self.task.seq_len
        lp, store = self._run_capturing(tokens, fwd_hooks, range(2))
        queries = torch.stack([torch.full((H,), L), torch.arange(H)], 1)
        all_keys = torch.stack([torch.arange(L + 1).repeat_interleave(H), torch.arange(H).repeat(L + 1)], 1)
        target_keys = queries.clone()
        return lp, [LayerAttention(store[0], queries, all_keys), LayerAttention(store[1], queries, target_keys)]


def read_out(logits: Float[Tensor, "batch pos vocab"], layout: Layout, d: int) -> Float[Tensor, "batch H d"]:
    """The target's log-probabilities from a next-token model's full logits: row h from position
    ``layout.prediction_positions()[h]`` (``task_log_probs``)."""
    pos = layout.prediction_positions().to(logits.device)
    first = layout.token_offset
    return task_log_probs(logits[:, pos.clamp_min(0), first : first + d], pos)


def task_log_probs(picked: Float[Tensor, "batch H d"], positions: Int[Tensor, " H"]) -> Float[Tensor, "batch H d"]:
    """The log-softmax over the task's ids of the logits read at ``positions`` (clamped at 0); a row that nothing
    predicts (x_0 of a lone target, position -1) is the uniform distribution, in every family."""
    out = picked.double().log_softmax(-1)
    unpredicted = (positions.to(out.device) < 0).view(1, -1, 1)
    return torch.where(unpredicted, torch.full_like(out, -math.log(out.shape[-1])), out)  # no in-place: autograd


class StandardSubject(Subject):
    """A decoder-only LM (TransformerLens hook names, ``model(ids) -> logits``) read with the ordinary
    next-token shift through its ``Layout``: the logits at position p predict the id at p + 1."""

    family = "standard"

    def __init__(self, model, task, layout: Layout, name: str, digest: str):
        super().__init__(model, task, layout, name, digest)
        per_layer = getattr(model, "n_heads", None)  # a family whose layers differ (Edelman et al.'s)
        self.n_heads = list(per_layer) if isinstance(per_layer, list) else [model.cfg.n_heads] * model.cfg.n_layers
        caps = {MARKOV_TASK} if isinstance(task, MarkovTreeTask) else set()
        self.capabilities = frozenset(caps | ({BAYES_TASK} if has_bayes(task) else set()))

    def _log_probs(self, tokens, fwd_hooks):
        ids = self.layout.encode(tokens).to(self.model.cfg.device)
        first, pos = self.layout.token_offset, self.layout.prediction_positions()
        with self.model.hooks(fwd_hooks=list(fwd_hooks)):
            picked = task_logits(self.model, ids, pos.clamp_min(0), slice(first, first + self.task.d_vocab),
                                 full=on_the_logits(fwd_hooks))  # fmt: skip
        return task_log_probs(picked, pos)

    def log_probs_and_attention(self, tokens, fwd_hooks=()):
        lp, store = self._run_capturing(tokens, fwd_hooks, range(self.n_layers))
        keys = self.layout.key_tokens()
        predicts = torch.cat([keys[1:], torch.full((1, 2), -1, dtype=torch.long)])  # position p predicts p + 1
        return lp, [LayerAttention(store[i], predicts, keys) for i in range(self.n_layers)]


# Hugging Face model types whose logits are ``lm_head(final hidden state)`` (an ``nn.Linear``) with nothing after
# it (no soft-capping, no logit scale): their task logits are read from lm_head's rows for the task's ids alone.
# Any other type reads the full logits (the same numbers, memory growing with its vocabulary).
COLUMN_READOUT_TYPES = ("gpt2",)


class _Unembedding(Exception):
    """Ends a forward pass at the input of the unembedding (``task_logits``), carrying it."""

    def __init__(self, resid: Tensor):
        super().__init__()
        self.resid = resid


UNEMBEDDING_HOOKS = ("unembed.hook_in", "unembed.hook_out")


def on_the_logits(fwd_hooks) -> bool:
    """Whether a hook sits on the unembedding (a name there, or a filter function that matches one): then the
    read-out must run the full unembedding, so that the hook fires (``task_logits``)."""
    return any(
        any(name(n) for n in UNEMBEDDING_HOOKS) if callable(name) else "unembed" in name for name, _ in fwd_hooks
    )


def task_logits(model, ids: Int[Tensor, "batch pos"], positions: Int[Tensor, " P"], columns: slice,
                full: bool = False) -> Float[Tensor, "batch P C"]:  # fmt: skip
    """``model(ids)``'s logits at ``positions`` over the vocabulary ``columns`` (the task's ids), computed for
    those only where the family allows: the unembedding's columns for the task's ids at the positions read, so
    that a read-out's memory and work grow with the task, not with the vocabulary. A net with ``logits_at``
    (``models.nets.hooked_transformer``, ``models.nets.edelman``) computes them itself; a ``TransformerBridge``
    over a model type of ``COLUMN_READOUT_TYPES`` runs to its unembedding's input (every hook before it fires
    as in a full pass) and applies lm_head's rows ``columns``; any other model runs in full and is sliced.
    The log-softmax over the task's ids (``Subject.log_probs``) reads these columns only, so the result is the
    full-vocabulary computation's, to float rounding. ``full``: the whole forward pass, sliced (a hook on the
    unembedding fires: ``on_the_logits``)."""
    if hasattr(model, "logits_at") and not full:
        return model.logits_at(ids, positions, columns)
    head = None if full else _column_readout(model)
    if head is None:
        logits = model(ids)
        logits = logits if isinstance(logits, Tensor) else logits.logits
        return logits[:, positions.to(logits.device), columns]

    def stop(module, args, kwargs):
        raise _Unembedding(args[0] if args else kwargs["hidden_states"])

    handle = model.unembed.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        model(ids)
    except _Unembedding as e:
        resid = e.resid[:, positions.to(e.resid.device)]
    else:
        raise RuntimeError("the forward pass never reached the unembedding")
    finally:
        handle.remove()
    bias = None if head.bias is None else head.bias[columns]
    return torch.nn.functional.linear(resid, head.weight[columns], bias)


def _column_readout(model) -> torch.nn.Linear | None:
    """The ``nn.Linear`` unembedding of a ``TransformerBridge`` whose model type reads its task's columns
    directly (``COLUMN_READOUT_TYPES``); None for any other model."""
    config = getattr(getattr(model, "original_model", None), "config", None)
    head = getattr(getattr(model, "unembed", None), "original_component", None)
    if getattr(config, "model_type", None) in COLUMN_READOUT_TYPES and type(head) is torch.nn.Linear:
        return head
    return None


class CatFormerSubject(Subject):
    """Nichani et al.'s CatFormer (``models.nets.catformer``): it reads the first T = n_ctx tokens of a context
    (every one but the last, which it only predicts); position p's read-out predicts token p + 1, and the
    first token, which nothing predicts, gets the uniform distribution."""

    family = "CatFormer"

    def __init__(self, model, task, layout: Layout, name: str, digest: str):
        super().__init__(model, task, layout, name, digest)
        self.n_heads = model.n_heads
        caps = {BILINEAR} | ({MARKOV_TASK} if isinstance(task, MarkovTreeTask) else set())
        self.capabilities = frozenset(caps | ({BAYES_TASK} if has_bayes(task) else set()))

    def _log_probs(self, tokens, fwd_hooks):
        T, d = self.model.cfg.n_ctx, self.task.d_vocab
        ids = self.layout.encode(tokens).to(self.model.cfg.device)[:, :T]
        with self.model.hooks(fwd_hooks=list(fwd_hooks)):
            return read_out(self.model(ids), self.layout, d)

    def log_probs_and_attention(self, tokens, fwd_hooks=()):
        lp, store = self._run_capturing(tokens, fwd_hooks, range(self.n_layers))
        keys = self.layout.key_tokens()
        T = self.model.cfg.n_ctx
        return lp, [LayerAttention(store[i], keys[1 : T + 1], keys[:T]) for i in range(self.n_layers)]


class ChenSubject(CatFormerSubject):
    """Chen et al.'s two-layer transformer (``models.nets.chen``), read as the CatFormer is: the first T = n_ctx
    tokens, position p predicting token p + 1 (its last row is their model's output). Its first layer's
    ``hook_pattern`` is the pattern of the zero row that predicts; its attention is not bilinear."""

    family = "Chen"

    def __init__(self, model, task, layout: Layout, name: str, digest: str):
        super().__init__(model, task, layout, name, digest)
        self.capabilities = self.capabilities - {BILINEAR}


# Resolving --checkpoint ---------------------------------------------------------------------------------


def subject_of(model, task, layout: Layout | None, name: str, digest: str, trained_on: str = "all") -> Subject:
    """Wrap a loaded model in the Subject of its family (``trained_on``: the positions its loss used)."""
    subject = _family(model, task, layout, name, digest)
    subject.trained_on = trained_on
    return subject


def _family(model, task, layout: Layout | None, name: str, digest: str) -> Subject:
    if isinstance(model, CausalTransformer):
        return DisentangledSubject(model, task, name, digest)
    if layout is None:
        layout = Layout(task.n_examples, task.seq_len, task.d_vocab)
    if isinstance(model, CatFormer):
        return CatFormerSubject(model, task, layout, name, digest)
    if isinstance(model, ChenTransformer):
        return ChenSubject(model, task, layout, name, digest)
    if layout is None:
        layout = Layout(task.n_examples, task.seq_len, task.d_vocab)
    return StandardSubject(model, task, layout, name, digest)


def load_subject(
    spec: str | Path, device: str = "cpu", *, key_map=None, config=None, dtype: str | None = None
) -> Subject:
    """The model at ``spec`` as the analyses see it: what ``--checkpoint`` resolves to
    (``models.loading.sources.resolve``, each file read once).

    Args:
        spec: a named checkpoint (``"default"``, ``"standard"``), a path in any of the formats ``models.load``
            reads, or ``theorem1:beta=B[,from=FOLDER]`` (the construction on a folder's task).
        device: where to put the weights.
        key_map (dict | str | Path | None): for a weight file in our parameterisation with other key names
            (``models.load``).
        config (dict | str | Path | None): for a bare weight file: our ``config.json`` or a ``task.json``.
        dtype: ``"float32"`` or ``"float64"`` (or ``torch.float32``, ``torch.float64``): convert the weights
            after loading.

    Returns:
        A ``DisentangledSubject`` (our model, the Theorem 1 construction), a ``StandardSubject`` (any decoder-only
        LM with TransformerLens hook names), or the subject of a peer's model family.

    Raises:
        ValueError: as ``models.load``: one line saying what was wrong and what was expected.
    """
    source = resolve(spec, device, dtype=dtype, key_map=key_map, config=config)
    subject = subject_of(source.model, source.task, source.layout, source.name, source.digest, source.trained_on or "all")
    # the flags of ``python -m analyses.X`` that load it again (a key map or config given as a dict has none)
    given = {"--key-map": key_map, "--config": config, "--dtype": dtype_name(dtype) if dtype is not None else None}
    subject.load_flags = ["--checkpoint", str(spec)] + [
        a for flag, value in given.items() if isinstance(value, (str, Path)) for a in (flag, str(value))
    ]
    return subject
