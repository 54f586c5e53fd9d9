"""Activation patching for the disentangled model, on ``transformer_lens.patching.generic_activation_patch``.

What a user of this model patches, clean activations into a corrupted run, one cell per forward pass:

- ``patch_copyer_heads``: each copyer head's copy u_h^k (``blocks.0.attn.hook_z[:, h, k]``), per target
  position h or at every position;
- ``patch_subspaces``: each residual subspace (s = 0 the token, s = k+1 the copy of head k) on the layer-2
  query side (``blocks.1.attn.hook_q``), key side (``blocks.1.attn.hook_k``) or in the residual itself
  (``blocks.0.hook_resid_post``), per position or at every position;
- ``patch_layer2_pattern``: the layer-2 pattern of one query position h (``blocks.1.attn.hook_pattern[:, 0, h]``).

Each builds its explicit ``index_df`` (the layers have different head counts, so TransformerLens's
``get_act_patch_*`` helpers, which sweep every layer with ``cfg.n_heads`` heads and the input length as
positions, do not apply; ``check_sweep`` turns that into one ValueError before the sweep runs). Every sweep of
the suite runs through this module's ``generic_activation_patch``: TransformerLens's, with the sweep checked
first. Keyword arguments go to it (``reduce``, ``baseline``). With the default scalar metric the
result is a tensor shaped by the cells (``[H, K]``, ``[K]``, ``[K+1, H]``, ``[K+1]``, ``[H]``); otherwise a
``PatchingResult`` whose flat cells follow its ``index_df``.
"""

from __future__ import annotations

import pandas as pd
from torch import Tensor
from transformer_lens import patching
from transformer_lens.patching import (
    layer_head_pos_pattern_patch_setter,
    layer_head_vector_patch_setter,
    layer_pos_head_vector_patch_setter,
    make_df_from_ranges,
)
from transformer_lens.utilities import get_act_name

SIDES = {"query": "q", "key": "k", "residual": "resid_post"}
_SIDE_LAYER = {"query": 1, "key": 1, "residual": 0}
_PATTERN_LIKE = ("hook_pattern", "hook_attn_scores")
_HEAD_VECTOR = ("hook_q", "hook_k", "hook_v", "hook_z", "hook_result")
ALTERNATIVE = (
    "use models.interp.patching (patch_copyer_heads, patch_subspaces, patch_layer2_pattern) or "
    "generic_activation_patch with an explicit index_df"
)


def index_df(layer: int, *ranges: tuple[str, int]) -> pd.DataFrame:
    """One row per cell: ``layer`` and the product of ``(name, size)`` ranges (the last varies fastest)."""
    df = make_df_from_ranges([1] + [n for _, n in ranges], ["layer"] + [name for name, _ in ranges])
    df["layer"] = layer
    return df


def subspace_patch_setter(d: int):
    """Setter for the index (layer, [pos,] subspace): patch ``act[:, pos, ..., s*d:(s+1)*d]`` (every
    position when the index has no pos); for ``[batch, H, D]`` and ``[batch, H, 1, D]`` activations."""

    def setter(corrupted: Tensor, index, clean: Tensor) -> Tensor:
        pos = index[1] if len(index) == 3 else slice(None)
        where = (slice(None), pos, Ellipsis, slice(index[-1] * d, (index[-1] + 1) * d))
        corrupted[where] = clean[where]
        return corrupted

    return setter


def _axis_dims(name: str) -> dict[str, int]:
    """Which dimension of a ``[batch, ...]`` activation each TransformerLens index column indexes."""
    if name.endswith(_PATTERN_LIKE):  # [batch, head, dest, src]
        return {"head_index": 1, "head": 1, "dest_pos": 2, "src_pos": 3}
    if name.endswith(_HEAD_VECTOR):  # [batch, pos, head, d]
        return {"pos": 1, "dest_pos": 1, "head_index": 2, "head": 2}
    return {"pos": 1, "dest_pos": 1}


def check_sweep(clean_cache, activation_name: str, cells: pd.DataFrame) -> None:
    """One ValueError, before anything runs, if a ``generic_activation_patch`` sweep over ``cells`` (its
    ``index_df``, first column the layer) indexes past an activation of this model, or patches one it
    has not. ``generic_activation_patch`` calls it before the first cell of every sweep."""
    cached = getattr(clean_cache, "cache_dict", clean_cache)
    if cached is None or activation_name is None or "layer" not in cells:
        return
    for layer, rows in cells.groupby("layer"):
        name = get_act_name(activation_name, layer=int(layer))
        if name not in cached:
            raise ValueError(
                f"this patching sweep patches {name}, which the model or the clean cache has not; {ALTERNATIVE}"
            )
        shape = list(cached[name].shape)
        for column, dim in _axis_dims(name).items():
            if column in rows and dim < len(shape) and int(rows[column].max()) >= shape[dim]:
                raise ValueError(
                    f"this patching sweep reaches {column}={int(rows[column].max())} of {name}, which is {shape} "
                    f"(the two layers differ: blocks.0 has K copyer heads, blocks.1 one head, and activations cover "
                    f"the H target positions, not the (L+1)H input tokens; TransformerLens's get_act_patch_* "
                    f"assume cfg.n_heads heads and input-length positions everywhere); {ALTERNATIVE}"
                )


def generic_activation_patch(
    model, corrupted_tokens, clean_cache, patching_metric, patch_setter, activation_name: str, index_df, **kwargs
):
    """``transformer_lens.patching.generic_activation_patch`` over the cells ``index_df``, once ``check_sweep``
    has found that every cell fits the model's activations (one ValueError before any forward pass)."""
    check_sweep(clean_cache, activation_name, index_df)
    return patching.generic_activation_patch(
        model, corrupted_tokens, clean_cache, patching_metric, patch_setter, activation_name, index_df=index_df, **kwargs
    )


def _sweep(model, corrupted_tokens, clean_cache, metric, setter, activation: str, cells, shape, kwargs):
    result = generic_activation_patch(
        model, corrupted_tokens, clean_cache, metric, setter, activation, index_df=cells, **kwargs
    )
    return result.view(shape) if isinstance(result, Tensor) else result


def patch_copyer_heads(model, corrupted_tokens, clean_cache, metric, by_position: bool = True, **kwargs):
    """Patch each copyer head's copy ``blocks.0.attn.hook_z[:, h, k]``: cells ``[H, K]`` (position h,
    head k) or, with ``by_position=False``, ``[K]`` (every position at once)."""
    K, H = model.cfg.n_copy_heads, model.cfg.seq_len
    if by_position:
        cells, setter, shape = index_df(0, ("pos", H), ("head_index", K)), layer_pos_head_vector_patch_setter, (H, K)
    else:
        cells, setter, shape = index_df(0, ("head_index", K)), layer_head_vector_patch_setter, (K,)
    return _sweep(model, corrupted_tokens, clean_cache, metric, setter, "z", cells, shape, kwargs)


def patch_subspaces(
    model, corrupted_tokens, clean_cache, metric, side: str = "query", by_position: bool = True, **kwargs
):
    """Patch each residual subspace s (0: the token, k+1: head k's copy) on ``side`` "query"
    (``blocks.1.attn.hook_q``; its token subspace is zero), "key" (``blocks.1.attn.hook_k``) or
    "residual" (``blocks.0.hook_resid_post``, both sides at once): cells ``[K+1, H]`` (subspace s,
    position h) or, with ``by_position=False``, ``[K+1]``."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {list(SIDES)}, got {side!r}")
    K, H, d = model.cfg.n_copy_heads, model.cfg.seq_len, model.cfg.d_vocab
    layer = _SIDE_LAYER[side]
    if by_position:
        cells, shape = index_df(layer, ("subspace", K + 1), ("pos", H))[["layer", "pos", "subspace"]], (K + 1, H)
    else:
        cells, shape = index_df(layer, ("subspace", K + 1)), (K + 1,)
    return _sweep(
        model, corrupted_tokens, clean_cache, metric, subspace_patch_setter(d), SIDES[side], cells, shape, kwargs
    )


def patch_layer2_pattern(model, corrupted_tokens, clean_cache, metric, **kwargs):
    """Patch the layer-2 pattern of each query position h, ``blocks.1.attn.hook_pattern[:, 0, h]``
    (its attention over the candidate parents h' < h): cells ``[H]``."""
    H = model.cfg.seq_len
    cells = index_df(1, ("head_index", 1), ("dest_pos", H))
    return _sweep(
        model,
        corrupted_tokens,
        clean_cache,
        metric,
        layer_head_pos_pattern_patch_setter,
        "pattern",
        cells,
        (H,),
        kwargs,
    )
