"""Heads named by what they read in the sequence (probes.roles.sequence_scores, analyses.inspect's
sequence_heads): the scores against a loop over every (context, head, query, key), and the naming rules
on hand-built attention (a previous-token head, an induction head, a head on the own token's parent)."""

from __future__ import annotations

import math

import pytest
import torch

from models.interp.inspection import sequence_heads
from probes import Layout
from probes.roles import sequence_scores


def _brute_force(pattern, keys, tokens, parents, H, order=1, own_is_predicted=False):
    """Each score from its definition, for a square causal pattern whose query q reads the token at key q
    (a causal LM) or, ``own_is_predicted``, sits at the slot of the token it predicts (the disentangled
    model's target layer: the current token is the one before). ``parents`` ``[B, H, P]``, -1 padded."""
    B, n, Q, K = pattern.shape
    names = ["previous_token", "induction", "induction_chance", "own_parent", "own_parent_chance"]
    names += [f"previous_{k}" for k in range(2, order + 1)]
    names += [f"{name}_chance" for name in ["previous_token", *names[5:]]]  # uniform over the q + 1 keys a row sees
    sums = {k: [0.0] * n for k in names}
    counts = {k: 0 for k in names}
    index = {tuple(keys[k].tolist()): k for k in range(K) if keys[k, 0] >= 0}
    tok = lambda b, l, h: int(tokens[b, l * H + h])  # noqa: E731
    for b in range(B):
        for q in range(Q):
            l, h = keys[q].tolist()
            if l < 0:
                continue
            cl, ch = (l, h - 1) if own_is_predicted else (l, h)
            ind = []
            if ch >= order - 1:  # the keys before the current token's
                ind = [k for k in range(index[(cl, ch)]) if keys[k, 0] >= 0 and keys[k, 1] >= order and all(
                    tok(b, int(keys[k, 0]), int(keys[k, 1]) - j) == tok(b, cl, ch - j + 1) for j in range(1, order + 1))]  # fmt: skip
            own_parents = [int(x) for x in parents[b, h] if x >= 0]
            rows = {f"previous_{k}" if k > 1 else "previous_token": h >= k for k in range(1, order + 1)}
            rows.update({f"{name}_chance": counted for name, counted in list(rows.items())})
            rows.update(induction=bool(ind), induction_chance=bool(ind), own_parent=h >= 1 and bool(own_parents))
            rows["own_parent_chance"] = rows["own_parent"]
            for name, counted in rows.items():
                counts[name] += counted
            seen = index[(cl, ch)] + 1 if ch >= 0 else q  # keys the query can see
            for j in range(n):
                row = pattern[b, j, q]
                for k in range(1, order + 1):
                    if h >= k:
                        name = "previous_token" if k == 1 else f"previous_{k}"
                        sums[name][j] += float(row[index[(l, h - k)]])
                        # uniform over what row q sees: keys 0..q (a causal LM), 0..q-1 (at the predicted slot)
                        sums[f"{name}_chance"][j] += 1 / (q if own_is_predicted else q + 1)
                if rows["own_parent"]:
                    sums["own_parent"][j] += float(sum(row[index[(l, pa)]] for pa in own_parents))
                    sums["own_parent_chance"][j] += len([pa for pa in own_parents if index[(l, pa)] < seen]) / seen
                if ind:
                    sums["induction"][j] += float(row[ind].sum())
                    sums["induction_chance"][j] += len([k for k in ind if k < seen]) / seen
    return {k: [v / counts[k] for v in vals] for k, vals in sums.items()}


def _random_parents(g, B, H, P):
    """[B, H, P] parents: P distinct earlier positions or none (a root), -1 padded."""
    out = torch.full((B, H, P), -1)
    for b in range(B):
        for h in range(1, H):
            if torch.rand(1, generator=g) < 0.8:
                k = min(P, h)
                out[b, h, :k] = torch.randperm(h, generator=g)[:k]
    return out


@pytest.mark.parametrize("bos,sep", [(None, None), (0, 1)])
@pytest.mark.parametrize("order,n_parents", [(1, 1), (2, 2), (3, 1)])
def test_sequence_scores_match_a_loop_over_every_key(bos, sep, order, n_parents):
    L, H, d = 2, 5, 2
    layout = Layout(L, H, d, bos=bos, sep=sep, token_offset=2 if bos is not None else 0)
    keys = layout.key_tokens()
    T = len(keys)
    g = torch.Generator().manual_seed(order)
    tokens = torch.randint(0, d, (3, (L + 1) * H), generator=g)
    parents = _random_parents(g, 3, H, n_parents)
    scores = torch.randn(3, 2, T, T, generator=g, dtype=torch.float64).masked_fill(
        torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf
    )
    pattern = scores.softmax(-1)
    predicts = torch.cat([keys[1:], torch.full((1, 2), -1)])  # position p predicts p + 1 (models.interp.subject)
    got = sequence_scores(pattern, predicts, keys, tokens, parents if n_parents > 1 else parents[..., 0], H, order)
    want = _brute_force(pattern, keys, tokens, parents, H, order)
    assert set(got) == set(want)
    for name, values in want.items():
        assert got[name].tolist() == pytest.approx(values, abs=1e-12), name


@pytest.mark.parametrize("order", [1, 2])
def test_rows_at_the_slot_of_the_predicted_token_read_the_token_before_as_current(order):
    """The disentangled model's target layer: query h sits at the slot of x_h (which it cannot see) and
    attends over h' < h; its current token is x_{h-1}."""
    L, H, d = 1, 7, 2
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, d, (4, (L + 1) * H), generator=g)
    keys = torch.stack([torch.full((H,), L), torch.arange(H)], 1)  # the target's slots
    scores = torch.randn(4, 1, H, H, generator=g, dtype=torch.float64).masked_fill(
        torch.ones(H, H, dtype=torch.bool).triu(), -math.inf
    )
    pattern = torch.cat([torch.zeros(4, 1, 1, H, dtype=torch.float64), scores[:, :, 1:].softmax(-1)], 2)
    parents = _random_parents(g, 4, H, 1)
    got = sequence_scores(pattern, keys, keys, tokens, parents[..., 0], H, order)
    want = _brute_force(pattern, keys, tokens, parents, H, order, own_is_predicted=True)
    for name, values in want.items():
        assert got[name].tolist() == pytest.approx(values, abs=1e-12), name


def _hand_built_heads(tokens, keys):
    """A [1, 3, T, T] causal pattern on the plain layout: head 0 on the previous token, head 1 spread over
    the tokens after earlier occurrences of the query's token in a sequence, head 2 on key 0 (a sink)."""
    T = tokens.shape[1]
    p = torch.zeros(1, 3, T, T)
    for q in range(T):
        p[0, 0, q, max(q - 1, 0)] = 1
        hits = [k for k in range(1, q) if keys[k, 1] >= 1 and tokens[0, k - 1] == tokens[0, q]]
        p[0, 1, q, hits or [0]] = 1 / max(len(hits), 1)
        p[0, 2, q, 0] = 1
    return p


def test_a_previous_token_head_and_an_induction_head_are_named_and_a_sink_is_not():
    H = 12
    tokens = torch.tensor([[0, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0]])
    layout = Layout(1, H // 2, 2)  # one demonstration and the target: 12 flat tokens
    keys = layout.key_tokens()
    parents = torch.tensor([[-1, 0, 1, 2, 3, 4]])  # a chain: the parent is the previous token
    pattern = _hand_built_heads(tokens, keys)
    predicts = torch.cat([keys[1:], torch.full((1, 2), -1)])
    seq = sequence_scores(pattern, predicts, keys, tokens, parents, H // 2)
    heads = [{"label": f"L0H{j}", "sequence": {k: v[j].item() for k, v in seq.items()}} for j in range(3)]
    named = sequence_heads(heads)
    assert named["previous_token"] == ["L0H0"]
    assert named["induction"] == ["L0H1"]
    assert named["own_parent"] == ["L0H0"]  # on a chain the previous-token head is the parent head
    assert seq["induction"][1] == pytest.approx(1.0)


def test_the_role_profiles_parent_mass_reads_every_parent_and_skips_roots():
    """role_profile's ``parent`` on a graph with roots and two parents: the mass on any parent of the
    query's token, averaged over the (context, query) pairs whose token has one, against a loop."""
    from probes.roles import role_profile

    L, H = 1, 5
    keys = Layout(L, H, 2).key_tokens()
    T = len(keys)
    predicts = torch.cat([keys[1:], torch.full((1, 2), -1)])
    g = torch.Generator().manual_seed(9)
    pattern = torch.randn(3, 2, T, T, generator=g, dtype=torch.float64).masked_fill(
        torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf
    ).softmax(-1)
    parents = _random_parents(g, 3, H, 2)
    assert (parents[:, 1:, 0] < 0).any()  # some roots past position 0
    got = role_profile(pattern, predicts, keys, parents, L)["parent"]
    for group, in_group in enumerate((lambda l: l < L, lambda l: l == L)):
        total = torch.zeros(2, dtype=torch.float64)
        count = 0
        for b in range(3):
            for q in range(T):
                l, h = predicts[q].tolist()
                ps = [int(x) for x in parents[b, h] if x >= 0] if l >= 0 and h >= 1 else []
                if ps and in_group(l):
                    count += 1
                    total += sum(pattern[b, :, q, l * H + p] for p in ps)
        assert got[:, group].tolist() == pytest.approx((total / count).tolist(), abs=1e-12)
