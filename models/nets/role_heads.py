"""A GPT-2-shaped model whose heads are, by construction, the roles researchers name first (issue 54): the
known answer ``analyses.inspect``'s role names are checked against (tests/models/interp/test_roles_constructed.py)
and the figure of docs/explanation/roles.md.

``role_heads_model(task)``: TransformerLens's parameter names (``models.nets.hooked_transformer``), attention
only, no LayerNorm, float64. Residual blocks: E (token one-hot), P (position one-hot), ONE (a constant), PREV
(the previous token, written by L0H1). Each head scores one key ``BETA`` above the rest (softmax leaves
e^-30 elsewhere):

- L0H0, a SINK: a constant query against a key on position 0;
- L0H1, a PREVIOUS-TOKEN head: the query at p against the key at p - 1; it writes the token it reads to PREV;
- L0H2, a SELF head: the query at p against the key at p;
- L0H3, a FIXED-OFFSET head: the query at p against the key at p - ``OFFSET``;
- L1H0, an INDUCTION head: the query's current token (E) against each key's previous token (PREV): it attends
  to the tokens that followed earlier occurrences of the current one;
- L1H1 to L1H3: zero queries and keys, so uniform causal attention (no role).

``roles=False``: every query and key zero, every head uniform. The unembedding is zero (it predicts nothing):
the model is for what its heads attend to."""

from __future__ import annotations

import torch

from models.nets.hooked_transformer import HookedTransformer, HookedTransformerConfig

BETA = 30.0  # the score a head gives its key over the others
OFFSET = 3  # the fixed-offset head's distance
ROLES = {"L0H0": "sink", "L0H1": "previous token", "L0H2": "self", "L0H3": f"offset {OFFSET}", "L1H0": "induction"}


def role_heads_model(task, roles: bool = True) -> HookedTransformer:
    """The model of the module docstring for ``task``'s plain layout (ids 0..d-1, (L + 1) H positions)."""
    V, T = task.d_vocab, (task.n_examples + 1) * task.seq_len
    E, P, ONE, PREV = 0, V, V + T, V + T + 1
    cfg = HookedTransformerConfig(n_layers=2, d_model=2 * V + T + 1, n_ctx=T, d_head=T, n_heads=4, d_vocab=V,
                                  attn_only=True, normalization_type=None, dtype="float64")  # fmt: skip
    model = HookedTransformer(cfg)
    c = BETA * cfg.d_head**0.5  # the scores are divided by sqrt(d_head)
    with torch.no_grad():
        model.embed.W_E[:, E : E + V] = torch.eye(V)
        model.pos_embed.W_pos[:, P : P + T] = torch.eye(T)
        model.pos_embed.W_pos[:, ONE] = 1.0
        a0, a1 = model.blocks[0].attn, model.blocks[1].attn
        a0.W_V[1, E : E + V, :V] = torch.eye(V)  # L0H1 writes the token it attends to (the previous one) to PREV
        a0.W_O[1, :V, PREV : PREV + V] = torch.eye(V)
        if not roles:
            return model
        for head in (1, 2, 3):  # the positional heads' keys: position k in slot k
            a0.W_K[head, P : P + T] = torch.eye(T)
        a0.W_Q[0, ONE, 0], a0.W_K[0, P, 0] = c, 1.0  # sink: every query scores position 0
        for p in range(T):
            a0.W_Q[2, P + p, p] = c  # self
            if p >= 1:
                a0.W_Q[1, P + p, p - 1] = c  # previous token
            if p >= OFFSET:
                a0.W_Q[3, P + p, p - OFFSET] = c  # fixed offset
        a1.W_Q[0, E : E + V, :V] = c * torch.eye(V)  # induction: the current token against each key's previous
        a1.W_K[0, PREV : PREV + V, :V] = torch.eye(V)
    return model
