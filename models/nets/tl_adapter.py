"""The ``CausalTransformer``'s TransformerLens face (``models.nets.causal_transformer`` holds its maths).

- ``HookedAdapter``: ``HookedRootModule`` with its hook API made to fit the model. ``blocks.0.attn.hook_result``
  exists only with ``cfg.use_attn_result``: a catch-all filter or hook skips it while it is off, naming it
  explicitly is an error at once; a hook name that does not exist is a one-line error naming the nearest
  ones (TransformerLens would cache nothing, or raise a KeyError); ``run_with_cache`` returns a ``CausalCache``.
- ``SharedPattern``: the content-free copyer scores and pattern as hooks see them, one ``[K, H, (L+1)H]``
  tensor broadcast over the batch, which refuses to be written into.
- ``CausalCache``: the ``ActivationCache`` with the residual helpers made to fit the disentangled residual.
"""

from __future__ import annotations

import difflib
import inspect

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor
from transformer_lens import ActivationCache, HookedRootModule
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import Slice

from models.plumbing.io import one_line

PATCHING = (
    "use models.interp.patching (patch_copyer_heads, patch_subspaces, patch_layer2_pattern) or its "
    "generic_activation_patch with an explicit index_df"
)

RESULT_HOOK = "blocks.0.attn.hook_result"


def place_copies(z: Float[Tensor, "batch pos K d"], d_model: int) -> Float[Tensor, "batch pos K D"]:
    """Head k's copy ``z[..., k, :]`` placed in residual subspace k+1 (subspace 0 is the token)."""
    b, p, k, d = z.shape
    result = z.new_zeros(b, p, k, d_model // d, d)
    heads = torch.arange(k, device=z.device)
    result[:, :, heads, heads + 1] = z
    return result.flatten(3)


# In-place operations that are not writes of the tensor's values, and the in-place operators.
_NOT_WRITES = {"requires_grad_", "retain_grad", "share_memory_"}
_IN_PLACE_OPERATORS = {
    f"__i{op}__" for op in "add sub mul matmul truediv floordiv mod pow and or xor lshift rshift".split()
} | {"__setitem__"}


def _is_write(func, args, kwargs) -> bool:
    """Whether ``func(*args, **kwargs)`` writes into a ``SharedPattern`` (its first argument or ``out=``)."""
    name = getattr(func, "__name__", "")
    target = args[0] if args else None
    in_place = name in _IN_PLACE_OPERATORS or (
        name.endswith("_") and not name.endswith("__") and name not in _NOT_WRITES
    )
    out = kwargs.get("out")
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return (in_place and isinstance(target, SharedPattern)) or any(isinstance(o, SharedPattern) for o in outs)


class SharedPattern(Tensor):
    """The copyer scores or pattern as hooks and caches see them: ONE ``[K, H, (L+1)H]`` tensor broadcast
    over the batch (stride 0, no memory per context), so writing into ``t[0]`` would change every context.
    Reading works as for any tensor (results that own new memory are plain tensors); writing into it or
    into a view of it raises one ValueError. Clone it first: a hook may return a per-context tensor."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_write(func, args, kwargs):
            raise ValueError(
                "the blocks.0 copyer scores/pattern are one [K, H, (L+1)H] tensor broadcast to every context "
                "(stride 0): writing into it would change every context; write into a .clone() instead "
                "(a hook may return the clone)"
            )
        with torch._C.DisableTorchFunctionSubclass():
            storages = {a.untyped_storage().data_ptr() for a in args if isinstance(a, SharedPattern)}
            out = func(*args, **kwargs)
            return _rewrap(out, storages)

    def __reduce_ex__(self, protocol):  # saved (torch.save, pickle) as the plain tensor it is
        with torch._C.DisableTorchFunctionSubclass():
            return self.as_subclass(Tensor).__reduce_ex__(protocol)


def _rewrap(out, storages: set):
    """Views of a SharedPattern stay SharedPatterns; tensors with memory of their own become plain."""
    if isinstance(out, (tuple, list)):
        return type(out)(_rewrap(o, storages) for o in out)
    if not isinstance(out, Tensor):
        return out
    if out.untyped_storage().data_ptr() in storages:
        return out.as_subclass(SharedPattern)
    return out.as_subclass(Tensor) if type(out) is not Tensor else out


def as_shared(t: Tensor, hook: HookPoint) -> Tensor:
    """``t`` marked as a SharedPattern when something is hooked at ``hook`` (free: a view)."""
    return t.as_subclass(SharedPattern) if hook.fwd_hooks or hook.bwd_hooks else t


class HookedAdapter(HookedRootModule):
    """``HookedRootModule`` made to fit a model with an optional ``RESULT_HOOK`` (``cfg.use_attn_result``)
    and layers of different shapes; its caches are ``CausalCache``."""

    # blocks.0.attn.hook_result exists only with cfg.use_attn_result: a catch-all filter or hook skips it
    # while it is off, naming it explicitly is an error at once; a hook name that does not exist is a
    # one-line error naming the nearest ones (TransformerLens would cache nothing, or raise a KeyError).
    def _hook_filter(self, names_filter):
        """A callable ``names_filter`` (None, str, list or callable, as TransformerLens takes them)."""
        if names_filter is None:
            names_filter = lambda name: True  # noqa: E731
        if isinstance(names_filter, str):
            names_filter = [names_filter]
        if callable(names_filter):
            return lambda name: names_filter(name) and (name != RESULT_HOOK or self.cfg.use_attn_result)
        if not isinstance(names_filter, (list, tuple, set)):
            raise ValueError(
                f"names_filter must be None, a hook name, a list of names or a callable, got {names_filter!r}"
            )
        for name in names_filter:
            self._check_hook_name(name)
        return lambda name: name in names_filter

    def _check_hook_name(self, name) -> None:
        if name not in self.hook_dict:
            near = difflib.get_close_matches(str(name), self.hook_dict, n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(near)}?" if near else "see model.hook_dict for the names"
            raise ValueError(f"{name!r} is not a hook point of {type(self).__name__}; {hint}")
        if name == RESULT_HOOK and not self.cfg.use_attn_result:
            raise ValueError(f"{RESULT_HOOK} is off: set model.cfg.use_attn_result = True to hook per-head results")

    def get_caching_hooks(self, names_filter=None, *args, **kwargs):
        return super().get_caching_hooks(self._hook_filter(names_filter), *args, **kwargs)

    def add_caching_hooks(self, names_filter=None, *args, **kwargs) -> dict:
        return super().add_caching_hooks(self._hook_filter(names_filter), *args, **kwargs)

    def add_hook(self, name, hook, *args, **kwargs) -> None:
        if isinstance(name, str):
            self._check_hook_name(name)
        else:
            name = self._hook_filter(name)
        super().add_hook(name, hook, *args, **kwargs)

    def _enable_hook_with_name(self, name: str, hook, dir) -> None:  # model.hooks / run_with_hooks, by name
        self._check_hook_name(name)
        super()._enable_hook_with_name(name, hook, dir)

    def _enable_hooks_for_points(self, hook_points, enabled, hook, dir) -> None:  # ... by a filter
        super()._enable_hooks_for_points(hook_points, self._hook_filter(enabled), hook, dir)

    def run_with_hooks(self, *args, **kwargs):
        """As ``HookedRootModule.run_with_hooks``; a hook that indexes past one of this model's activations
        (an IndexError) is one ValueError naming the shapes. ``transformer_lens.patching``'s ``get_act_patch_*``
        helpers do that here: they index every layer by ``cfg.n_heads`` and the input length, and this model's
        layers differ; ``models.interp.patching`` checks a whole sweep before its first forward pass."""
        try:
            return super().run_with_hooks(*args, **kwargs)
        except IndexError as e:
            raise ValueError(
                f"a hook indexed past an activation of {type(self).__name__} ({one_line(e)}): blocks.0 has K copyer "
                "heads, blocks.1 one head, and activations cover the H target positions, not the (L+1)H input "
                f"tokens (TransformerLens's get_act_patch_* assume cfg.n_heads heads and input-length positions "
                f"everywhere); {PATCHING}"
            ) from e

    def run_with_cache(self, *args, incl_bwd: bool = False, **kwargs) -> tuple[Tensor | None, CausalCache]:
        """As ``HookedRootModule.run_with_cache``; the cache is a ``CausalCache`` (an ``ActivationCache``).
        ``incl_bwd=True`` needs a scalar output: ``return_type="loss"``."""
        if incl_bwd and kwargs.get("return_type") != "loss":
            if "return_type" in inspect.signature(self.forward).parameters:
                raise ValueError(
                    "run_with_cache(incl_bwd=True) backpropagates the output, which must be a scalar: "
                    "pass return_type='loss' (mean NLL of the target tokens x_1..x_{H-1})"
                )
            raise ValueError(
                f"run_with_cache(incl_bwd=True) needs a scalar output, which {type(self).__name__} has not; "
                "use model.hooks(bwd_hooks=...) and call .backward() on your loss"
            )
        out, cache = super().run_with_cache(*args, incl_bwd=incl_bwd, **kwargs)
        return out, CausalCache(cache, self)


# Methods of ActivationCache that rest on parts this model has not, with what to use instead.
_NOT_THIS_ARCHITECTURE = {
    "accumulated_resid": "no residual stream runs through both layers (blocks.0 reads the [batch, (L+1)H, d] "
    "one-hot context and writes the [batch, H, (K+1)d] disentangled residual that blocks.1 reads; blocks.1 "
    "outputs a distribution); use cache['resid_post', 0], or model.decompose_resid(cache) for its pieces",
    "logit_lens": "there is no unembedding (the output mixes the value distributions softmax(resid W_OV)); use "
    "cache.logit_attrs(pieces, tokens) for each piece's share of the value logits",
    "apply_ln_to_stack": "the model has no LayerNorm; use the stack as it is",
    "get_full_resid_decomposition": "the model has no MLPs or LayerNorm; use model.decompose_resid(cache)",
    "stack_neuron_results": "the model has no MLPs; use cache.stack_head_results() for the copyer heads",
    "get_neuron_results": "the model has no MLPs; use cache.stack_head_results() for the copyer heads",
}


class MissingActivation(KeyError, ValueError):
    """A cache key that is not there: a KeyError (as a dict raises) that reads as one line."""

    def __str__(self) -> str:
        return str(self.args[0])


def _refusal(name: str, why: str):
    def refuse(self, *args, **kwargs):
        raise ValueError(f"cache.{name}() does not apply to this model: {why}")

    refuse.__name__ = name
    refuse.__doc__ = f"Not for this architecture: {why}."
    return refuse


class CausalCache(ActivationCache):
    """The ``ActivationCache`` of a ``CausalTransformer``, with the residual helpers made to fit it.

    The one residual stream is the disentangled residual ``blocks.0.hook_resid_post`` (= what blocks.1
    reads), of width (K+1)d: ``decompose_resid`` splits it into the token and blocks.0's output,
    ``stack_head_results`` into blocks.0's K per-head copies (``layer`` defaults to 1, the heads before
    blocks.1: blocks.1's head writes a distribution, not into the residual), ``logit_attrs`` gives each
    piece's share of the value logits ``resid @ W_OV``. Stacking activations of layers whose shapes differ,
    and the helpers that need an unembedding, MLPs or LayerNorm, are one-line ValueErrors.
    """

    def __getitem__(self, key) -> Tensor:
        try:
            return super().__getitem__(key)
        except KeyError as e:
            missing = str(e.args[0]) if e.args else str(key)
            if missing in self.model.hook_dict:
                near, why = difflib.get_close_matches(missing, self.cache_dict, n=3, cutoff=0.5), "is not cached"
            else:
                near = difflib.get_close_matches(missing, self.model.hook_dict, n=3, cutoff=0.5)
                why = f"is not a hook point of {type(self.model).__name__} (it has no such part)"
            hint = f"nearest: {', '.join(near)}" if near else "see model.hook_dict"
            raise MissingActivation(f"{missing!r} {why}; {hint}") from None

    def apply_slice_to_batch_dim(self, batch_slice) -> CausalCache:
        sliced = super().apply_slice_to_batch_dim(batch_slice)
        return CausalCache(sliced.cache_dict, self.model, has_batch_dim=sliced.has_batch_dim)

    def _residual_layer(self, layer, what: str) -> int:
        """``layer`` of a residual helper: None, -1 and 1 mean the disentangled residual blocks.1 reads."""
        if layer is None or layer in (-1, 1):
            return 1
        if layer == 0:
            return 0
        raise ValueError(
            f"cache.{what}(layer={layer!r}): blocks.1 has no skip connection (its output [batch, H, d] is the "
            "head's mixture, not a residual sum); use layer=1 (the default), the residual blocks.1 reads"
        )

    def token_piece(self) -> Float[Tensor, "batch H D"]:
        """The token x_h in subspace 0 of the disentangled residual (zeros elsewhere)."""
        cfg = self.model.cfg
        if "blocks.0.hook_resid_post" in self.cache_dict:
            token = self["blocks.0.hook_resid_post"][..., : cfg.d_vocab]
        else:
            token = self["hook_embed"][..., -cfg.seq_len :, :]
        return F.pad(token, (0, cfg.d_model - cfg.d_vocab))

    def head_results(self) -> Float[Tensor, "batch H K D"]:
        """blocks.0's per-head results: cached ones, else each copy placed in its subspace."""
        if RESULT_HOOK in self.cache_dict:
            return self[RESULT_HOOK]
        return place_copies(self["blocks.0.attn.hook_z"], self.model.cfg.d_model)

    def compute_head_results(self) -> None:
        """Cache both layers' per-head results (``hook_result``) from their ``hook_z``."""
        if RESULT_HOOK not in self.cache_dict:
            self.cache_dict[RESULT_HOOK] = self.head_results()
        if "blocks.1.attn.hook_result" not in self.cache_dict:
            self.cache_dict["blocks.1.attn.hook_result"] = self["blocks.1.attn.hook_z"]  # one head: z is its output

    def stack_head_results(
        self, layer: int = -1, return_labels: bool = False, incl_remainder: bool = False, pos_slice=None, apply_ln=False
    ):
        """blocks.0's K head results ``[K, batch, H, D]`` (labels "L0H0"...), each the head's copy in its own
        subspace; with ``incl_remainder`` a last piece, the residual minus them (the token). ``layer`` 1 (the
        default here) or 0 (nothing)."""
        if apply_ln:
            raise ValueError("cache.stack_head_results(apply_ln=True): the model has no LayerNorm; drop apply_ln")
        layer = self._residual_layer(layer, "stack_head_results")
        pos = Slice(pos_slice)
        K = self.model.cfg.n_copy_heads
        heads = pos.apply(self.head_results(), dim=-3).movedim(-2, 0) if layer else self.token_piece()[:0]
        labels = [f"L0H{k}" for k in range(K)] if layer else []
        if incl_remainder:
            resid = pos.apply(self["blocks.0.hook_resid_post"], dim=-2)
            heads, labels = torch.cat([heads, (resid - heads.sum(0))[None]]), [*labels, "remainder"]
        return (heads, labels) if return_labels else heads

    def decompose_resid(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        mode: str = "all",
        apply_ln: bool = False,
        pos_slice=None,
        incl_embeds: bool = True,
        return_labels: bool = False,
    ):
        """The residual blocks.1 reads as [embed, 0_attn_out] ``[2, batch, H, D]``: the token x_h (subspace
        0) and blocks.0's output (every copy); they sum to ``blocks.0.hook_resid_post`` exactly. ``layer=0``:
        blocks.0's input, [embed] ``[1, batch, (L+1)H, d]``. Per head: ``stack_head_results`` or
        ``model.decompose_resid(cache)``."""
        if mode not in ("all", "mlp", "attn"):
            raise ValueError(f"mode must be 'all', 'mlp' or 'attn', got {mode!r}")
        if apply_ln or mlp_input:
            raise ValueError("cache.decompose_resid: the model has no LayerNorm and no MLPs; drop apply_ln / mlp_input")
        layer = self._residual_layer(layer, "decompose_resid")
        d = self.model.cfg.d_vocab
        pieces, labels = [], []
        if incl_embeds:
            pieces.append(self.token_piece() if layer else self["hook_embed"])
            labels.append("embed")
        if layer and mode != "mlp":
            pieces.append(F.pad(self["blocks.0.attn.hook_z"].flatten(2), (d, 0)))
            labels.append("0_attn_out")
        if not pieces:
            raise ValueError("cache.decompose_resid: nothing to decompose (no embeds, no attention); expected a piece")
        stack = torch.stack([Slice(pos_slice).apply(p, dim=-2) for p in pieces])
        return (stack, labels) if return_labels else stack

    def logit_attrs(self, residual_stack: Float[Tensor, "n *batch_pos D"], tokens, incorrect_tokens=None) -> Tensor:
        """Each piece's share of the VALUE logits ``resid @ W_OV`` (linear in the residual, so the shares of
        ``model.decompose_resid`` pieces sum to them): what each key position h' offers for token ``tokens``
        (an int, ``[batch]`` or ``[batch, H]``), minus ``incorrect_tokens`` if given. The output itself is an
        attention-weighted mixture of ``softmax(value logits)``, not a linear readout: there is no direct
        logit attribution to it."""
        W_OV = self.model.W_OV
        if residual_stack.shape[-1] != W_OV.shape[0]:
            raise ValueError(
                f"residual_stack must end in the residual width (K+1)d = {W_OV.shape[0]}, got {tuple(residual_stack.shape)}"
            )

        def directions(t) -> Tensor:
            t = torch.as_tensor(t, device=W_OV.device)
            return W_OV.T[t if t.ndim != 1 else t[:, None]]  # [D], [batch, 1, D] or [batch, H, D]

        direction = directions(tokens)
        if incorrect_tokens is not None:
            direction = direction - directions(incorrect_tokens)
        return (residual_stack * direction.to(residual_stack.dtype)).sum(-1)

    def stack_activation(self, activation_name: str, layer: int = -1, sublayer_type: str | None = None) -> Tensor:
        """As ``ActivationCache.stack_activation``, where the layers' shapes agree."""
        n = self.model.cfg.n_layers if layer in (None, -1) else layer
        parts = [self[(activation_name, l, sublayer_type)] for l in range(n)]
        shapes = {tuple(p.shape) for p in parts}
        if len(shapes) > 1:
            raise ValueError(
                f"cache.stack_activation({activation_name!r}): the layers differ in shape "
                f"({' vs '.join(str(list(p.shape)) for p in parts)}: blocks.0 has K copyer heads over the whole "
                f"context, blocks.1 one head over the H target positions); index each, cache[{activation_name!r}, 0] "
                f"and cache[{activation_name!r}, 1]"
            )
        return torch.stack(parts)


for _name, _why in _NOT_THIS_ARCHITECTURE.items():
    setattr(CausalCache, _name, _refusal(_name, _why))
