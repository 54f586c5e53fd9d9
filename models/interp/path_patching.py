"""Path patching on a subject: a layer-0 head's corrupted output fed only into the keys and values of
layer-1 heads (``path_patch``, through ``sender_delta``), and dropping a demonstration from what layer-1
heads read, compared with BMA without it (``drop_demonstration_hook``, ``bma_without``). Used by
``analyses.standard_circuit``."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from models.interp.interventions import Intervention, head_outputs, hooks, patch_heads
from models.interp.subject import Subject, head_label
from probes import bma_predictive, target_nll


def kl_rows(p_log: Float[Tensor, "batch H d"], q_log: Float[Tensor, "batch H d"]) -> Float[Tensor, " H"]:
    """KL(p || q) per target position, averaged over contexts."""
    return (p_log.exp() * (p_log - q_log)).sum(-1).mean(0)


@torch.no_grad()
def layer0_outputs(subject: Subject, tokens, corrupted) -> tuple[Tensor, Tensor]:
    """Layer 0's ``hook_z`` ``[batch, T, head, d_head]`` on the clean and on the corrupted contexts: what every
    ``sender_delta`` on those contexts reads (one pass each, made once for a whole sweep of paths)."""
    return head_outputs(subject, tokens, [0])[0], head_outputs(subject, corrupted, [0])[0]


@torch.no_grad()
def sender_delta(subject: Subject, tokens, corrupted, sender: int, positions,
                 outputs: tuple[Tensor, Tensor] | None = None) -> Float[Tensor, "batch T D"]:  # fmt: skip
    """The change in the residual stream that layer-0 head ``sender`` writes when its output (``hook_z``,
    through ``W_O``) at ``positions`` comes from the corrupted run; zero elsewhere. ``outputs``:
    ``layer0_outputs(subject, tokens, corrupted)``, if the caller has it."""
    z_clean, z_bad = layer0_outputs(subject, tokens, corrupted) if outputs is None else outputs
    W_O = subject.model.blocks[0].attn.W_O[sender].to(z_clean.dtype)  # [d_head, d_model]
    delta = torch.zeros(*z_clean.shape[:2], W_O.shape[1], dtype=z_clean.dtype, device=z_clean.device)
    delta[:, positions] = (z_bad - z_clean)[:, positions, sender] @ W_O
    return delta


# Where a sender's change enters: blocks.0.hook_attn_out is layer 0's attention output as it is added to the
# residual, so a change there reaches the MLP and, past it, layer 1 (the direct path and the path through
# MLP0). Not blocks.0.hook_resid_mid: on a TransformerBridge editing it changes only ln_2's input, so an
# edit there measured the path through MLP0 alone (tests/models/interp/test_circuit.py shows both).
THROUGH_MLP_SITE, DIRECT_SITE = "blocks.0.hook_attn_out", "blocks.1.hook_resid_pre"


@torch.no_grad()
def path_patch(subject: Subject, tokens, corrupted, senders: list[int], receivers: list[int], positions,
               through_mlp: bool = False, log: list | None = None,
               outputs: tuple[Tensor, Tensor] | None = None) -> float:  # fmt: skip
    """NLL of the clean run in which layer-1 heads ``receivers`` read keys and values computed from the
    clean residual plus the ``sender_delta`` of layer-0 heads ``senders``; everything else clean. The
    receivers' queries at the target positions see the clean residual (``positions`` are the
    demonstrations'), so only their keys and values change. ``through_mlp``: the change enters with layer
    0's attention output (the direct path and the path sender -> MLP0 -> receiver), else after the MLP
    (the direct path only). ``outputs``: ``layer0_outputs(subject, tokens, corrupted)``, if the caller has it
    (a sweep over paths runs the contexts twice, not twice per path)."""
    outputs = layer0_outputs(subject, tokens, corrupted) if outputs is None else outputs
    delta = sum(sender_delta(subject, tokens, corrupted, s, positions, outputs) for s in senders)
    site = THROUGH_MLP_SITE if through_mlp else DIRECT_SITE
    moved = Intervention(site, "add", positions=tuple(int(p) for p in positions), value=delta,
                         source="layer-0 senders' outputs from the run on another tree's demonstrations")  # fmt: skip
    store = {}

    def grab(z, hook):
        store[1] = z.detach().clone()

    subject.log_probs(tokens, [*hooks([moved], log), (subject.head_output(1), grab)])
    patched = patch_heads(subject, 1, receivers, store, log, name="the run with the senders' change")
    return target_nll(subject.log_probs(tokens, patched), tokens)


def drop_demonstration_hook(subject: Subject, heads: list[int], l: int, renormalise: bool):
    """A ``hook_pattern`` hook zeroing ``heads``' (layer 1) attention from the target queries to the
    tokens of demonstration l (``renormalise``: the rows then rescaled to sum to one)."""
    queries = subject.layout.prediction_positions().view(-1, 1)
    keys = subject.layout.token_positions()[l].view(1, -1)

    def hook(pattern, hook=None):
        mask = torch.ones(pattern.shape[1:], dtype=pattern.dtype, device=pattern.device)
        for j in heads:
            mask[j, queries, keys] = 0
        pattern = pattern * mask
        return pattern / pattern.sum(-1, keepdim=True).clamp_min(1e-30) if renormalise else pattern

    return [(subject.pattern_hook(1), hook)]


@torch.no_grad()
def bma_without(subject: Subject, tokens, heads: list[int], renormalise: bool = False) -> dict:
    """Dropping demonstration l from what ``heads`` (layer 1) read, every l in turn: the slope and
    correlation of the model's change in predictive probabilities (target, h >= 1) on BMA's change when
    l is dropped, and the mean KL(BMA without l || model) with and without the intervention, beside
    KL(BMA || model) of the clean model."""
    task = subject.task
    L, H = task.n_examples, task.seq_len
    clean = subject.log_probs(tokens)
    bma = bma_predictive(task.pi, tokens, L, H, task.root, log=True).double()
    rows = {"slope": 0.0, "correlation": 0.0, "kl_without_vs_ablated": 0.0, "kl_without_vs_clean": 0.0}
    for l in range(L):
        keep = [k for k in range(L) if k != l]
        without = bma_predictive(task.pi, tokens, L, H, task.root, demonstrations=keep, log=True).double()
        ablated = subject.log_probs(tokens, drop_demonstration_hook(subject, heads, l, renormalise))
        dm = (ablated.exp() - clean.exp())[:, 1:].flatten()
        db = (without.exp() - bma.exp())[:, 1:].flatten()
        rows["slope"] += ((dm * db).sum() / (db * db).sum()).item() / L
        rows["correlation"] += torch.corrcoef(torch.stack([dm, db]))[0, 1].item() / L
        rows["kl_without_vs_ablated"] += kl_rows(without, ablated)[1:].mean().item() / L
        rows["kl_without_vs_clean"] += kl_rows(without, clean)[1:].mean().item() / L
    rows["kl_bma_vs_clean"] = kl_rows(bma, clean)[1:].mean().item()
    rows["heads"] = [head_label(1, j) for j in heads]
    return rows
