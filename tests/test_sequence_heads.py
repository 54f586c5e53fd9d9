"""Heads named by what they read in the sequence (probes.roles.sequence_scores, analyses.inspect's
sequence_heads): the scores against a loop over every (context, head, query, key), and the naming rules
on hand-built attention (a previous-token head, an induction head, a head on the own token's parent)."""

from __future__ import annotations

import math

import pytest
import torch

from analyses.inspect import sequence_heads
from probes import Layout
from probes.roles import sequence_scores


def _brute_force(pattern, keys, tokens, parents, H):
    """Each score from its definition, for a square causal pattern (query q reads the token at key q)."""
    B, n, Q, K = pattern.shape
    sums = {k: [0.0] * n for k in ("previous_token", "induction", "induction_chance", "own_parent")}
    counts = {"prev": 0, "ind": 0}
    tok = lambda b, k: int(tokens[b, keys[k, 0] * H + keys[k, 1]])  # noqa: E731
    for b in range(B):
        for q in range(Q):
            l, h = keys[q].tolist()
            if l < 0:
                continue
            ind = [k for k in range(q) if keys[k, 0] >= 0 and keys[k, 1] >= 1
                   and int(tokens[b, keys[k, 0] * H + keys[k, 1] - 1]) == tok(b, q)]  # fmt: skip
            if h >= 1:
                counts["prev"] += 1
            if ind:
                counts["ind"] += 1
            for j in range(n):
                row = pattern[b, j, q]
                if h >= 1:
                    prev = [k for k in range(K) if keys[k].tolist() == [l, h - 1]]
                    sums["previous_token"][j] += float(row[prev].sum())
                    pa = [k for k in range(K) if keys[k].tolist() == [l, int(parents[b, h])]]
                    sums["own_parent"][j] += float(row[pa].sum())
                if ind:
                    sums["induction"][j] += float(row[ind].sum())
                    seen = list(range(q + 1))  # the keys a causal LM sees
                    sums["induction_chance"][j] += len(set(ind) & set(seen)) / len(seen)
    return {
        k: [v / counts["prev" if k in ("previous_token", "own_parent") else "ind"] for v in vals]
        for k, vals in sums.items()
    }


@pytest.mark.parametrize("bos,sep", [(None, None), (0, 1)])
def test_sequence_scores_match_a_loop_over_every_key(bos, sep):
    L, H, d = 2, 4, 3
    layout = Layout(L, H, d, bos=bos, sep=sep, token_offset=2 if bos is not None else 0)
    keys = layout.key_tokens()
    T = len(keys)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, d, (3, (L + 1) * H), generator=g)
    parents = torch.stack(
        [torch.tensor([-1] + [int(torch.randint(0, h, (1,), generator=g)) for h in range(1, H)]) for _ in range(3)]
    )
    scores = torch.randn(3, 2, T, T, generator=g, dtype=torch.float64).masked_fill(
        torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf
    )
    pattern = scores.softmax(-1)
    predicts = torch.cat([keys[1:], torch.full((1, 2), -1)])  # position p predicts p + 1 (models.subject)
    got = sequence_scores(pattern, predicts, keys, tokens, parents, H)
    want = _brute_force(pattern, keys, tokens, parents, H)
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
