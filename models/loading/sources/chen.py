"""Chen et al.'s two-layer transformers (``models.nets.chen``) as their code leaves them: the model's
``state_dict()`` in a ``.pt``, task.json beside it. Two shapes:

- ``TwoLayerTransformer`` (``RPE/train.py``): ``layer1.W`` [T, H], ``layer1.q_proj``, ``layer1.k_proj``,
  ``layer1.o_v_proj`` [S, S, H], ``layer1.norm.*`` [S], ``layer2.C_alpha_list`` [1, n], ``layer2.a`` [1],
  ``layer2.mydegree`` [2^(H+1), H+1]. ``q_proj``/``k_proj``/``o_v_proj`` are parameters under their
  ``--q-k-o-v-list`` default ``[True, True]``; a file without them is refused.
- ``SimplifiedTwoLayerTransformer`` (``RPE/train_simplified.py``, their ``jobs/3-gram.sh``): ``layer1.W``,
  ``layer2.C_alpha_list``, ``layer2.a``, ``layer2.mydegree`` and nothing else; no tensor holds S, which is
  then the task's vocabulary.

Their code keeps no config: S, T and H are read from the shapes, and ``low_degree`` from the number of kept
alphas (n = the alphas with |alpha| <= low_degree). The sizes are checked before anything is built: layer 2's
degree table has 2^(H+1) rows and its features, per context, T^2 n entries."""

from __future__ import annotations

import torch

from models.loading.sources import files
from models.loading.sources.files import Found, Source
from models.loading.sources.task_json import read_task
from models.nets.chen import ChenConfig, ChenTransformer, all_degrees, n_kept, their_key
from models.plumbing.io import UsageError, check_memory

NAME = "Chen et al. TwoLayerTransformer"
FULL = ("layer1.W", "layer1.q_proj", "layer1.k_proj", "layer1.o_v_proj", "layer1.norm.weight", "layer2.C_alpha_list")
SIMPLIFIED = ("layer1.W", "layer2.C_alpha_list", "layer2.a")
SIMPLIFIED_ALL = {*SIMPLIFIED, "layer2.mydegree"}


def detect(found: Found) -> bool:
    return files.torch_state_dict_with(found, "layer1.W", "layer2.C_alpha_list")


def shape_of(state: dict) -> str:
    """``"full"`` (TwoLayerTransformer) or ``"simplified"`` (SimplifiedTwoLayerTransformer); else one line
    naming the keys found and the two sets expected."""
    if all(k in state for k in FULL):
        return "full"
    if set(state) <= SIMPLIFIED_ALL and all(k in state for k in SIMPLIFIED):
        return "simplified"
    layer1 = sorted(k for k in state if k.startswith("layer1."))
    missing = [k for k in FULL if k not in state]
    raise UsageError(
        f"a state dict of neither of their shapes: it has {', '.join(layer1) or 'no layer1 tensor'} in layer 1 "
        f"and lacks {', '.join(missing)} of TwoLayerTransformer's (trained with --q-k-o-v-list False, q_proj, "
        f"k_proj or o_v_proj are fixed tensors their state_dict() leaves out); expected all of {', '.join(FULL)}, "
        f"or SimplifiedTwoLayerTransformer's {', '.join(sorted(SIMPLIFIED_ALL))} and nothing else"
    )


def config_of(state: dict, where: str, d_vocab: int | None = None) -> ChenConfig:
    """S, T, H and low_degree from the shapes of their state dict (S: the task's ``d_vocab`` for the simplified
    model, which holds no [S] tensor), each checked and sized before anything is built (one line naming the
    file, the tensor, its shape and what was expected)."""
    try:
        kind = shape_of(state)
    except ValueError as e:
        raise UsageError(f"{where}: {e}") from None
    W = state["layer1.W"]
    if W.ndim != 2 or min(W.shape) < 1:
        raise UsageError(f"{where}: layer1.W has shape {tuple(W.shape)}; expected [T, H] (their W: T rows, one column a head)")
    T, H = W.shape
    if kind == "full":
        d_vocab = state["layer1.norm.weight"].shape[0] if state["layer1.norm.weight"].ndim == 1 else 0
        if d_vocab < 1:
            raise UsageError(f"{where}: layer1.norm.weight has shape {tuple(state['layer1.norm.weight'].shape)}; expected [S]")
    C = state["layer2.C_alpha_list"]
    if C.ndim != 2 or C.shape[0] != 1:
        raise UsageError(f"{where}: layer2.C_alpha_list has shape {tuple(C.shape)}; expected [1, n] (one head)")
    n = C.shape[-1]
    # layer 2's degree table (2^(H+1) rows of H+1: built from int64 bits, kept as float32 in the model, in the
    # file and in the check of the file's; 24 bytes an entry) and one context's features (T^2 n, 3 float32 copies)
    check_memory(
        24 * 2 ** (H + 1) * (H + 1) + 12 * T * T * n,
        f"{where}: layer1.W of shape [{T}, {H}] (H = {H} heads: layer 2's degree table of 2^{H + 1} rows, "
        f"features of T^2 x {n} per context)",
    )
    low = next((D for D in [*range(H + 2), -1] if n_kept(H, D) == n and D != H + 1), None)
    if low is None:
        raise UsageError(f"{where}: layer2.C_alpha_list has {n} alphas; H={H} heads allow C(H+1, <=D) of them")
    return ChenConfig(d_vocab=d_vocab, n_ctx=T, n_heads=H, low_degree=low, simplified=kind == "simplified")


def read(found: Found, device: str | None = None, *, weights: bool = True) -> Source:
    raw, where = found.task_json_beside(NAME)
    task, layout = read_task(raw, where)
    if not weights:
        return Source(None, task, layout, found.where, "", NAME)
    state = files.strip_prefixes(found.state_dict())
    cfg = config_of(state, found.where, task.d_vocab)
    cfg.device = device or "cpu"
    files.check_fits(layout, cfg.d_vocab, cfg.n_ctx + 1, found.where)  # it reads T tokens and predicts the next
    model = ChenTransformer(cfg)
    degree = state.pop("layer2.mydegree", None)
    if degree is not None and not torch.equal(degree.float().cpu(), all_degrees(cfg.n_heads)):
        raise UsageError(f"{found.where}: layer2.mydegree is not their itertools.product degree table")
    files.load_their_names(model, state, their_key, found.where, skip={"blocks.1.attn.mydegree"})
    name = "Chen et al. SimplifiedTwoLayerTransformer" if cfg.simplified else NAME
    # their read-out is the last row, the only position their loss used (as the CatFormer's)
    return Source(model.to(cfg.device).eval(), task, layout, found.where, found.digest(), name, trained_on="last")
