"""Chen et al.'s ``TwoLayerTransformer`` (``models.nets.chen``) as their code leaves it: its ``state_dict()`` in a
``.pt`` (keys ``layer1.W`` [T, H], ``layer1.q_proj``, ``layer1.k_proj``, ``layer1.o_v_proj`` [S, S, H],
``layer1.norm.*`` [S], ``layer2.C_alpha_list`` [1, n], ``layer2.a`` [1], ``layer2.mydegree`` [2^(H+1), H+1]),
and task.json beside it. Their code keeps no config: S, T and H are read from the shapes, and ``low_degree``
from the number of kept alphas (n = the alphas with |alpha| <= low_degree). ``q_proj``/``k_proj``/``o_v_proj``
are parameters under their ``--q-k-o-v-list`` default ``[True, True]``; a file without them is refused."""

from __future__ import annotations

import torch

from models.loading.sources import files
from models.loading.sources.files import Found, Source
from models.loading.sources.task_json import read_task
from models.nets.chen import ChenConfig, ChenTransformer, all_degrees, kept, their_key
from models.plumbing.io import UsageError

NAME = "Chen et al. TwoLayerTransformer"
NEEDED = ("layer1.W", "layer1.q_proj", "layer1.k_proj", "layer1.o_v_proj", "layer1.norm.weight", "layer2.C_alpha_list")


def detect(found: Found) -> bool:
    return files.torch_state_dict_with(found, "layer1.W", "layer2.C_alpha_list")


def config_of(state: dict, where: str) -> ChenConfig:
    """S, T, H and low_degree from the shapes of their state dict (one line naming what is missing)."""
    missing = [k for k in NEEDED if k not in state]
    if missing:
        raise UsageError(
            f"{where}: their TwoLayerTransformer state dict lacks {', '.join(missing)} (trained with "
            f"--q-k-o-v-list False, these are fixed tensors their state_dict() leaves out); expected all of {', '.join(NEEDED)}"
        )
    T, H = state["layer1.W"].shape
    S = state["layer1.norm.weight"].shape[0]
    n = state["layer2.C_alpha_list"].shape[-1]
    low = next((D for D in [*range(H + 2), -1] if len(kept(H, D)) == n and D != H + 1), None)
    if low is None:
        raise UsageError(f"{where}: layer2.C_alpha_list has {n} alphas; H={H} heads allow C(H+1, <=D) of them")
    return ChenConfig(d_vocab=S, n_ctx=T, n_heads=H, low_degree=low)


def read(found: Found, device: str | None = None, *, weights: bool = True) -> Source:
    raw, where = found.task_json_beside(NAME)
    task, layout = read_task(raw, where)
    if not weights:
        return Source(None, task, layout, found.where, "", NAME)
    state = files.strip_prefixes(found.state_dict())
    cfg = config_of(state, found.where)
    cfg.device = device or "cpu"
    files.check_fits(layout, cfg.d_vocab, cfg.n_ctx + 1, found.where)  # it reads T tokens and predicts the next
    model = ChenTransformer(cfg)
    degree = state.pop("layer2.mydegree", None)
    if degree is not None and not torch.equal(degree.float().cpu(), all_degrees(cfg.n_heads)):
        raise UsageError(f"{found.where}: layer2.mydegree is not their itertools.product degree table")
    files.load_their_names(model, state, their_key, found.where, skip={"blocks.1.attn.mydegree"})
    return Source(model.to(cfg.device).eval(), task, layout, found.where, found.digest(), NAME)
