"""What a head attends to, relative to the query: the measurements behind a head's role.

Every query row that feeds the prediction of a task token (l, h) (``query_predicts[q] = (l, h)``) is
measured, and its attention split by where each key (l', h') sits relative to that token:

- ``prefix``: the same sequence, earlier positions (l' = l, h' < h), the query's own position excluded;
- ``self``: the query's own position (``own_key``; in a causal LM the token x_{h-1}^l, in the
  disentangled model the slot of x_h^l itself);
- ``same_position``: the same position h in other sequences (l' != l, h' = h): a copy of x_h^{l'};
- ``other_position``: other positions in other sequences (l' != l, h' != h);
- ``later``: the same sequence at h' >= h (invisible to a causal LM);
- ``special``: keys that hold no task token (BOS, separators).

These six partition the keys. Two more overlap them: ``candidates`` (l' = l, h' < h, the query's own
position included: the candidate parents of x_h^l) and ``parent`` (the true parent (l, pa(h)), or any of
several on a multi-parent graph; every sequence of a context shares one graph). Queries are split into demonstration queries (l < L) and target
queries (l = L); ``candidates`` averages over queries with h >= 1 only (h = 0 has no candidate), ``parent``
over those whose token has a parent (every h >= 1 on a tree; a graph's roots have none).

Pure functions of a pattern and its labels: no model code (``models.interp.subject.LayerAttention`` supplies
the labels, ``probes.tasks`` the parents).
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

PARTITION = ("prefix", "self", "same_position", "other_position", "later", "special")
OVERLAPPING = ("candidates", "parent")
CATEGORIES = PARTITION + OVERLAPPING
GROUPS = ("demonstration", "target")
ROLE_MASS = 0.5  # a role needs at least this share of the head's attention
ROLE_OVER_CHANCE = 2.0  # ... and this many times what uniform causal attention puts there (its chance)

# The name of a head whose attention is mostly in one category (the readable role).
ROLE_NAMES = {
    "prefix": "within-sequence (prefix) head",
    "self": "current-token head",
    "same_position": "cross-demonstration same-position reader",
    "other_position": "cross-sequence other-position head",
    "later": "same-sequence later-position head",
    "special": "BOS/separator sink",
}


def own_key(n_queries: int, query_predicts: Int[Tensor, "Q 2"], key_token: Int[Tensor, "K 2"]) -> Int[Tensor, " Q"]:
    """The key index of each query's own position (-1: none among the keys). A square pattern whose
    queries are the key positions (a causal LM, the disentangled model's target layer) maps q to q;
    otherwise query q sits at the key that holds the token it predicts (the disentangled model's
    target rows over the full context)."""
    if n_queries == len(key_token):
        return torch.arange(n_queries)
    match = (key_token.unsqueeze(0) == query_predicts.unsqueeze(1)).all(-1)  # [Q, K]
    return torch.where(match.any(1), match.int().argmax(1), torch.full((n_queries,), -1))


def category_masks(
    query_predicts: Int[Tensor, "Q 2"], key_token: Int[Tensor, "K 2"], own: Int[Tensor, " Q"]
) -> dict[str, Bool[Tensor, "Q K"]]:
    """The six partition masks (every key of every query in exactly one) and ``candidates``."""
    ql, qh = query_predicts[:, :1], query_predicts[:, 1:]
    kl, kh = key_token[:, 0].unsqueeze(0), key_token[:, 1].unsqueeze(0)
    is_self = torch.arange(len(key_token)).unsqueeze(0) == own.unsqueeze(1)
    task_key = (kl >= 0) & ~is_self
    same_seq = task_key & (kl == ql)
    return {
        "prefix": same_seq & (kh < qh),
        "self": is_self,
        "same_position": task_key & (kl != ql) & (kh == qh),
        "other_position": task_key & (kl != ql) & (kh != qh),
        "later": same_seq & (kh >= qh),
        "special": (kl < 0) & ~is_self,
        "candidates": (kl == ql) & (kl >= 0) & (kh < qh),
    }


def parent_mask(
    query_predicts: Int[Tensor, "Q 2"], key_token: Int[Tensor, "K 2"], parents: Int[Tensor, "batch H *P"]
) -> Bool[Tensor, "batch Q K"]:
    """Per context, the keys holding a true parent (l, pa(h)) of each query's token (l, h), h >= 1;
    ``parents`` ``[batch, H]`` or ``[batch, H, P]`` (several parents, -1 padding)."""
    ql, qh = query_predicts[:, 0], query_predicts[:, 1]
    return _holds(ql, (ql >= 0) & (qh >= 1), key_token, _parents_of(parents, qh))


def _parents_of(parents: Int[Tensor, "batch H *P"], h: Int[Tensor, " Q"]) -> Int[Tensor, "batch Q P"]:
    """The parents of position h (clamped at 0) of each query, -1 padded."""
    return (parents if parents.ndim == 3 else parents.unsqueeze(-1))[:, h.clamp_min(0)]


def _holds(
    ql: Int[Tensor, " Q"], ok: Bool[Tensor, " Q"], key_token: Int[Tensor, "K 2"], positions: Int[Tensor, "batch Q P"]
) -> Bool[Tensor, "batch Q K"]:
    """Whether key k holds (ql, h') for one of the ``positions`` h' (-1: none), for the queries ``ok``."""
    same_seq = ok.view(1, -1, 1) & (key_token[:, 0].view(1, 1, -1) == ql.view(1, -1, 1))  # [1, Q, K]
    return same_seq & (key_token[:, 1].view(1, 1, 1, -1) == positions.unsqueeze(-1)).any(2)


def uniform_causal(pattern: Float[Tensor, "batch head Q K"], own: Int[Tensor, " Q"] | None = None) -> Float[Tensor, "Q K"]:
    """Uniform causal attention: each query row spread evenly over the keys it can attend, the chance every
    mass is compared with. Those keys: every key before the query's own (``own``, default: row q's own key is
    key q, a causal LM's square pattern), and any key the pattern gives weight in some context or head (the
    own key itself in a causal LM; not the slot of the token a disentangled target row predicts). A head that
    blocks keys a causal mask leaves open (a model built to attend within its sequence) is compared with the
    causal mask's keys, not with its own support."""
    Q, K = pattern.shape[-2:]
    own = torch.arange(Q) if own is None else own.cpu()
    visible = (pattern > 0).flatten(0, 1).any(0).cpu() | (torch.arange(K).unsqueeze(0) < own.unsqueeze(1))
    return (visible.double() / visible.sum(-1, keepdim=True).clamp_min(1)).to(pattern.device)


def clears_chance(mass: float, chance: float) -> bool:
    """A role's mass is named: at least ``ROLE_MASS`` and ``ROLE_OVER_CHANCE`` times its chance."""
    return mass == mass and mass >= ROLE_MASS and mass >= ROLE_OVER_CHANCE * (chance if chance == chance else 0.0)


def role_profile(
    pattern: Float[Tensor, "batch head Q K"],
    query_predicts: Int[Tensor, "Q 2"],
    key_token: Int[Tensor, "K 2"],
    parents: Int[Tensor, "batch H"],
    n_examples: int,
) -> dict[str, Float[Tensor, "head 2"]]:
    """Mean attention mass per category (``CATEGORIES``) for each head, ``[head, group]`` with groups
    ``GROUPS`` (demonstration queries, target queries), averaged over contexts and queries; NaN for a
    group with no query. Beside each, ``<category>_chance``: the same mass under ``uniform_causal`` attention
    (``parent_chance``: attention uniform over the candidate parents, the sharper baseline of parent
    selection: what a head attending to a fixed candidate, the sequence's first token say, puts on the
    parent)."""
    p = pattern.double()
    own = own_key(p.shape[2], query_predicts, key_token)
    masks = category_masks(query_predicts, key_token, own)
    candidates = masks["candidates"].double()
    uniform = uniform_causal(p, own).expand(1, 1, -1, -1)
    out = _profile(p, masks, query_predicts, key_token, parents, n_examples)
    chance = _profile(uniform, masks, query_predicts, key_token, parents, n_examples)
    by_candidates = (candidates / candidates.sum(-1, keepdim=True).clamp_min(1)).to(p.device).expand(1, 1, -1, -1)
    chance["parent"] = _profile(by_candidates, masks, query_predicts, key_token, parents, n_examples)["parent"]
    heads = p.shape[1]
    return {**out, **{f"{k}_chance": v.expand(heads, -1).clone() for k, v in chance.items()}}


def _profile(p, masks, query_predicts, key_token, parents, L) -> dict[str, Tensor]:
    """``role_profile``'s masses of pattern ``p`` ``[batch or 1, head or 1, Q, K]``."""
    per_query = {name: (p * m.to(p.device)).sum(-1) for name, m in masks.items()}  # [batch, head, Q]
    per_query["parent"] = (p * parent_mask(query_predicts, key_token, parents).unsqueeze(1).to(p.device)).sum(-1)
    ql, qh = query_predicts[:, 0], query_predicts[:, 1]
    groups = [(ql >= 0) & (ql < L), ql == L]
    has_parent = (_parents_of(parents, qh) >= 0).any(-1).to(p.device)  # [batch, Q]: a graph's roots have none
    nan = p.new_full(p.shape[1:2], float("nan"))
    out = {}
    for name, mass in per_query.items():
        mass = mass.expand(len(parents), -1, -1)
        cols = []
        for g in groups:
            rows = (g & (qh >= 1) if name in OVERLAPPING else g).to(p.device)
            if name == "parent":  # per context: the queries whose token has a parent
                w = (rows & has_parent).unsqueeze(1).double()  # [batch, 1, Q]
                cols.append((mass * w).sum((0, 2)) / w.sum() if w.any() else nan)
            else:
                cols.append(mass[:, :, rows].mean((0, 2)) if rows.any() else nan)
        out[name] = torch.stack(cols, -1).cpu()
    return out


def dominant(profile: dict[str, Float[Tensor, " 2"]], group: int) -> tuple[str, float]:
    """The partition category holding most of one head's attention from one query group, and its mass."""
    masses = {name: float(profile[name][group]) for name in PARTITION}
    name = max(masses, key=lambda n: masses[n] if masses[n] == masses[n] else -1.0)
    return name, masses[name]


# Categories that together make a broader role when no single one holds ``ROLE_MASS``.
BROAD_ROLES = (
    (("prefix", "self"), "within-sequence (prefix) head"),
    (("same_position", "other_position"), "cross-sequence head"),
)


def group_role(profile: dict[str, Float[Tensor, " 2"]], group: int) -> tuple[str, str] | None:
    """The role of one head from one query group, with the numbers behind it (None if the group has no
    query): the category holding at least ``ROLE_MASS`` of its attention and ``ROLE_OVER_CHANCE`` times its
    chance (``<category>_chance``, when the profile has it); else a broad role (``BROAD_ROLES``: the same
    sequence with the query's own position, or the other sequences) that clears both; else ``no role``."""

    def chance(members) -> float:
        return sum(float(profile[f"{m}_chance"][group]) if f"{m}_chance" in profile else 0.0 for m in members)

    def words(what: str, mass: float, members) -> str:
        return f"{what} {mass:.2f}" + (f" (chance {chance(members):.2f})" if f"{members[0]}_chance" in profile else "")

    name, mass = dominant(profile, group)
    if mass != mass:  # no query of this group
        return None
    if clears_chance(mass, chance([name])):
        return ROLE_NAMES[name], words(name, mass, [name])
    for members, role in BROAD_ROLES:
        total = sum(float(profile[m][group]) for m in members)
        if clears_chance(total, chance(members)):
            return role, words(" + ".join(members), total, members)
    return "no role", "largest: " + words(name, mass, [name])


def attention_role(profile: dict[str, Float[Tensor, " 2"]]) -> str:
    """A readable role from one head's profile (``role_profile`` sliced at the head), from the
    demonstration and the target queries (``group_role``), with the masses behind it:
    ``"within-sequence (prefix) head [demonstration: prefix 0.56; target: prefix + self 0.80]"``."""
    parts = [(label, r) for g, label in enumerate(GROUPS) if (r := group_role(profile, g)) is not None]
    if not parts:
        raise ValueError("the profile has no demonstration or target query")
    details = "; ".join(f"{label}: {detail}" for label, (_, detail) in parts)
    if len({role for _, (role, _) in parts}) == 1:
        return f"{parts[0][1][0]} [{details}]"
    return "; ".join(f"{role} from {label} queries" for label, (role, _) in parts) + f" [{details}]"


# Heads named by what they read in the token sequence (in-context Markov chains, fixed graphs) -------------
SEQUENCE_SCORES = ("previous_token", "previous_token_chance", "induction", "induction_chance", "own_parent",
                   "own_parent_chance")  # and previous_k with its chance, k = 2..order


def sequence_scores(
    pattern: Float[Tensor, "batch head Q K"],
    query_predicts: Int[Tensor, "Q 2"],
    key_token: Int[Tensor, "K 2"],
    tokens: Int[Tensor, "batch n_tokens"],
    parents: Int[Tensor, "batch H *P"],
    seq_len: int,
    order: int = 1,
) -> dict[str, Float[Tensor, " head"]]:
    """Per head, from every query whose own key holds a task token (l, h) (``own_key``; in a causal LM
    the token the query position reads), the attention mass on:

    - ``previous_token``: the key holding (l, h - 1) (queries with h >= 1); with ``order`` m >= 2 also
      ``previous_k``, the key holding (l, h - k), k = 2..m (queries with h >= k); each with its ``_chance``,
      the mass ``uniform_causal`` attention puts there;
    - ``induction``: every key before the current token's (below), (l', h') with h' >= m, whose m predecessors
      (l', h' - m .. h' - 1) hold the query's CURRENT token and the m - 1 before it (queries with at least
      one such key). The current token is the last one the query sees: its own key's in a causal LM; the
      one before it where the own key holds the token the query predicts (the disentangled model, whose
      rows sit at the slot of x_h). m = 1 is the induction head of in-context Markov chains, m = n - 1 the
      generalized induction head of an n-gram (Chen et al.). ``induction_chance``: the mass uniform
      attention over the keys up to the current token's (what the query can see) would put there;
    - ``own_parent``: the keys holding a parent (l, pa(h)) of the query's own token (queries whose token
      has a parent; ``parents`` ``[batch, H]`` or ``[batch, H, P]``, -1 for none), and ``own_parent_chance``,
      what uniform attention over the keys up to the current token's would put there.

    ``tokens`` are the task's flat tokens (``l * H + h``); NaN for a score with no query."""
    H, m = seq_len, order
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"the induction order must be an integer >= 1, got {m!r}")
    p = pattern.double().cpu()
    own = own_key(p.shape[2], query_predicts, key_token)
    own_tok = torch.where((own >= 0).unsqueeze(1), key_token[own.clamp_min(0)], torch.full((len(own), 2), -1))
    ol, oh = own_tok[:, 0], own_tok[:, 1]
    kl, kh = key_token[:, 0], key_token[:, 1]
    is_task = kl >= 0
    at_predicted = (own_tok == query_predicts).all(-1) & (ol >= 0)  # the own key holds the predicted token
    cl, ch = ol, oh - at_predicted.long()  # the current token
    match = (key_token.unsqueeze(0) == torch.stack([cl, ch], 1).unsqueeze(1)).all(-1)  # [Q, K]
    cur_key = torch.where(match.any(1), match.int().argmax(1), own)

    def token_at(l: Tensor, h: Tensor, valid: Tensor, missing: int) -> Tensor:  # [batch, len(l)]
        return torch.where(valid, tokens[:, (l * H + h).clamp_min(0)], missing)

    keys_before = [token_at(kl, kh - j, is_task & (kh >= j), -2) for j in range(1, m + 1)]  # [batch, K] each
    query_back = [token_at(cl, ch - j, (cl >= 0) & (ch >= j), -3) for j in range(m)]  # [batch, Q] each
    earlier = torch.arange(len(key_token)).unsqueeze(0) < cur_key.unsqueeze(1)  # [Q, K]
    ind = earlier.unsqueeze(0) & (kh >= m).view(1, 1, -1)
    for before, back in zip(keys_before, query_back):
        ind = ind & (before.unsqueeze(1) == back.unsqueeze(2))  # [batch, Q, K]
    ind_q = ind.any(-1)  # [batch, Q]

    def at_offset(k: int) -> tuple[Tensor, Tensor]:  # [Q, K] mask of the key (l, h - k), [Q] rows
        rows = (ol >= 0) & (oh >= k)
        return rows.unsqueeze(1) & (kl.unsqueeze(0) == ol.unsqueeze(1)) & (kh.unsqueeze(0) == oh.unsqueeze(1) - k), rows

    has_prev = (ol >= 0) & (oh >= 1)
    own_parents = _parents_of(parents, oh)  # [batch, Q, P]
    own_pa = _holds(ol, has_prev, key_token, own_parents)  # [batch, Q, K]
    has_parent = has_prev & (own_parents >= 0).any(-1)
    prev, prev_rows = at_offset(1)
    uniform = uniform_causal(p, own)  # [Q, K]
    heads = p.shape[1]

    def score(mask: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:  # key mask [(batch,) Q, K], rows [(batch,) Q]
        rows = rows.expand(len(p), -1)
        mass, chance = (p * mask.unsqueeze(-3)).sum(-1), (uniform * mask).sum(-1)  # [batch, head, Q], [(batch,) Q]
        return _mean_over(mass, rows), _mean_over(chance.unsqueeze(-2).expand(len(p), 1, -1), rows).expand(heads).clone()

    out = {}
    masks = {"previous_token": (prev, prev_rows), "induction": (ind, ind_q), "own_parent": (own_pa, has_parent),
             **{f"previous_{k}": at_offset(k) for k in range(2, m + 1)}}  # fmt: skip
    for name, (mask, rows) in masks.items():
        out[name], out[f"{name}_chance"] = score(mask, rows)
    return out


def _mean_over(mass: Float[Tensor, "batch head Q"], rows: Bool[Tensor, "batch Q"]) -> Float[Tensor, " head"]:
    """The mean of ``mass`` over contexts and the query ``rows`` of each, per head (NaN without one)."""
    if not rows.any():
        return mass.new_full(mass.shape[1:2], float("nan"))
    w = rows.unsqueeze(1).double().expand_as(mass)
    return (mass * w).sum((0, 2)) / w.sum((0, 2))


# Heads named by where they attend, whatever the content: sinks, self heads, fixed offsets --------------------
POSITION_SCORES = ("sink", "sequence_start", "self", "offsets")  # each with its ``_chance``


def position_scores(
    pattern: Float[Tensor, "batch head Q K"], query_predicts: Int[Tensor, "Q 2"], key_token: Int[Tensor, "K 2"]
) -> dict[str, Tensor]:
    """Per head, the mean attention mass over the queries whose own key holds a task token (``own_key``), on:

    - ``sink``: the context's first key (its BOS, or the first demonstration's first token), from queries
      past it;
    - ``sequence_start``: the first token (l, 0) of the query's own sequence l, from queries at h >= 1;
    - ``self``: the query's own key;
    - ``offsets`` ``[head, K - 1]``: the key k positions before the own key, k = 1 .. K - 1 (column k - 1),
      from queries with at least k keys before their own.

    Each with ``<name>_chance``: the same mass under ``uniform_causal`` attention, on the same queries (the
    mean of 1 / (keys visible) for one key)."""
    p = pattern.double().cpu()
    own = own_key(p.shape[2], query_predicts, key_token)
    uniform = uniform_causal(p, own).unsqueeze(0).unsqueeze(0)  # [1, 1, Q, K]
    Q, K = p.shape[2:]
    keys = torch.arange(K)
    ol, oh = torch.where((own >= 0).unsqueeze(1), key_token[own.clamp_min(0)], torch.full((Q, 2), -1)).unbind(1)
    start = (key_token[:, 0].unsqueeze(0) == ol.unsqueeze(1)) & (key_token[:, 1] == 0).unsqueeze(0)  # [Q, K]
    masks = {
        "sink": ((keys == 0).unsqueeze(0) & (own > 0).unsqueeze(1), own > 0),
        "sequence_start": (start & (oh >= 1).unsqueeze(1), (ol >= 0) & (oh >= 1)),
        "self": (keys.unsqueeze(0) == own.unsqueeze(1), own >= 0),
    }
    heads, out = p.shape[1], {}
    for name, (mask, rows) in masks.items():
        for key, att in ((name, p), (f"{name}_chance", uniform)):
            mass = (att * mask.double()).sum(-1)  # [batch or 1, head or 1, Q]
            out[key] = _mean_over(mass, rows.expand(len(mass), -1)).expand(heads).clone()
    back = own.unsqueeze(1) - torch.arange(1, K).unsqueeze(0)  # [Q, K - 1]: the key k back
    ok = back >= 0
    for key, att in (("offsets", p), ("offsets_chance", uniform)):
        at = att.gather(3, back.clamp_min(0).expand(*att.shape[:2], -1, -1))  # [batch or 1, head or 1, Q, K - 1]
        w = ok.double().expand_as(at)
        mean = (at * w).sum((0, 2)) / w.sum((0, 2)).clamp_min(1)
        out[key] = mean.where(ok.any(0), torch.tensor(float("nan"))).expand(heads, -1).clone()
    return out


def best_offset(offsets: Float[Tensor, " offset"]) -> int | None:
    """The offset k >= 2 (column k - 1 of ``position_scores``' ``offsets``) of most mass; None with fewer."""
    offsets = torch.as_tensor(offsets, dtype=torch.float64)
    return int(offsets[1:].nan_to_num(-1.0).argmax()) + 2 if len(offsets) > 1 else None


POSITION_NAMES = {"sink": "sink head (the context's first key)", "sequence_start": "sequence-start head",
                  "self": "self head (its own position)"}  # fmt: skip


def position_role(scores: dict) -> tuple[str, str] | None:
    """The positional role of one head (``position_scores`` sliced at it, plain numbers or lists), with the
    numbers behind it, or None: the first of sink, sequence start, self whose mass clears its chance
    (``clears_chance``); else the offset k >= 2 of most mass, if it clears its chance, a FIXED-OFFSET head
    (offset 1 is the previous-token head of ``sequence_scores``)."""
    for name, words in POSITION_NAMES.items():
        mass, chance = float(scores[name]), float(scores[f"{name}_chance"])
        if clears_chance(mass, chance):
            return words, f"{name} {mass:.2f}, chance {chance:.2f}"
    if (k := best_offset(scores["offsets"])) is not None:
        mass, chance = float(scores["offsets"][k - 1]), float(scores["offsets_chance"][k - 1])
        if clears_chance(mass, chance):
            return f"fixed-offset head ({k} positions back)", f"offset {k} {mass:.2f}, chance {chance:.2f}"
    return None
