"""probes.roles: the role profile against a loop over every (context, head, query, key)."""

from __future__ import annotations

import math

import pytest
import torch

from probes import Layout
from probes.roles import CATEGORIES, PARTITION, ROLE_NAMES, attention_role, category_masks, own_key, role_profile


def _brute_force(pattern, predicts, keys, parents, L, own):
    """Mean mass per category and group, written from the module docstring's definitions."""
    B, n, Q, K = pattern.shape
    sums = {c: [[0.0, 0.0] for _ in range(n)] for c in CATEGORIES}
    counts = {c: [0, 0] for c in CATEGORIES}
    for q in range(Q):
        l, h = predicts[q].tolist()
        if l < 0:
            continue
        g = 1 if l == L else 0
        for c in CATEGORIES:
            if c in ("candidates", "parent") and h < 1:
                continue
            counts[c][g] += B
            for b in range(B):
                for j in range(n):
                    for k in range(K):
                        kl, kh = keys[k].tolist()
                        is_self = k == own[q]
                        hit = {
                            "self": is_self,
                            "special": kl < 0 and not is_self,
                            "prefix": kl == l and kh < h and not is_self,
                            "later": kl == l and kh >= h and not is_self,
                            "same_position": kl >= 0 and kl != l and kh == h and not is_self,
                            "other_position": kl >= 0 and kl != l and kh != h and not is_self,
                            "candidates": kl == l and kh < h,
                            "parent": kl == l and kh == parents[b, h].item(),
                        }[c]
                        if hit:
                            sums[c][j][g] += pattern[b, j, q, k].item()
    return {
        c: [[s / counts[c][g] if counts[c][g] else math.nan for g, s in enumerate(row)] for row in sums[c]]
        for c in CATEGORIES
    }


def _causal_pattern(B, n, T, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, n, T, T, generator=g, dtype=torch.float64)
    return logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -torch.inf).softmax(-1)


@pytest.mark.parametrize("bos_sep", [False, True])
def test_profile_of_a_causal_lm_matches_the_loop(bos_sep):
    L, H = 2, 3
    layout = Layout(L, H, 4, bos=0 if bos_sep else None, sep=1 if bos_sep else None, token_offset=2 if bos_sep else 0)
    keys = layout.key_tokens()
    T = len(keys)
    predicts = torch.cat([keys[1:], torch.full((1, 2), -1)])
    pattern = _causal_pattern(3, 2, T, seed=1)
    parents = torch.tensor([[0, 0, 1], [0, 0, 0], [0, 0, 1]])
    got = role_profile(pattern, predicts, keys, parents, L)
    want = _brute_force(pattern, predicts, keys, parents, L, own_key(T, predicts, keys).tolist())
    for c in CATEGORIES:
        assert torch.allclose(got[c], torch.tensor(want[c], dtype=torch.float64), equal_nan=True), c
    # A causal pattern never reaches later positions of its own sequence; the partition sums to one.
    assert got["later"].abs().max() == 0
    total = sum(got[c] for c in PARTITION)
    assert torch.allclose(total, torch.ones_like(total))


def test_target_rows_over_the_full_context_find_their_own_slot():
    L, H = 2, 3  # the disentangled model's layer 0: H target queries over all (L+1) H keys
    keys = Layout(L, H, 4).key_tokens()
    predicts = torch.stack([torch.full((H,), L), torch.arange(H)], 1)
    own = own_key(H, predicts, keys)
    assert own.tolist() == [L * H + h for h in range(H)]
    pattern = torch.rand(2, 3, H, len(keys), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    pattern /= pattern.sum(-1, keepdim=True)
    parents = torch.tensor([[0, 0, 0], [0, 0, 1]])
    got = role_profile(pattern, predicts, keys, parents, L)
    want = _brute_force(pattern, predicts, keys, parents, L, own.tolist())
    for c in CATEGORIES:
        assert torch.allclose(got[c], torch.tensor(want[c], dtype=torch.float64), equal_nan=True), c
    assert torch.isnan(got["prefix"][:, 0]).all()  # no demonstration query


def test_partition_masks_are_disjoint_and_cover_every_key():
    layout = Layout(3, 4, 5, bos=0, token_offset=1)
    keys = layout.key_tokens()
    predicts = torch.cat([keys[1:], torch.full((1, 2), -1)])
    masks = category_masks(predicts, keys, own_key(len(keys), predicts, keys))
    cover = sum(masks[c].int() for c in PARTITION)
    assert torch.equal(cover, torch.ones_like(cover))


def test_role_names_follow_the_dominant_category():
    def profile(**mass):
        return {c: torch.tensor(mass.get(c, (0.0, 0.0)), dtype=torch.float64) for c in CATEGORIES}

    assert attention_role(profile(prefix=(0.7, 0.6), self=(0.3, 0.4))) == (
        f"{ROLE_NAMES['prefix']} [demonstration: prefix 0.70; target: prefix 0.60]"
    )
    mixed = attention_role(profile(prefix=(0.8, 0.1), same_position=(0.1, 0.9)))
    assert mixed == (
        f"{ROLE_NAMES['prefix']} from demonstration queries; {ROLE_NAMES['same_position']} from target queries "
        "[demonstration: prefix 0.80; target: same_position 0.90]"
    )
    # No single category holds half, the sequence with the query's own position does: still within-sequence.
    broad = attention_role(profile(prefix=(0.4, 0.4), self=(0.3, 0.3), other_position=(0.3, 0.3)))
    assert broad == f"{ROLE_NAMES['prefix']} [demonstration: prefix + self 0.70; target: prefix + self 0.70]"
    spread = profile(prefix=(0.3, 0.3), self=(0.1, 0.1), same_position=(0.2, 0.2), other_position=(0.2, 0.2))
    spread["special"] = torch.tensor((0.2, 0.2), dtype=torch.float64)
    assert attention_role(spread) == "no role [demonstration: largest: prefix 0.30; target: largest: prefix 0.30]"
    # Half the attention is not a role when uniform causal attention would put a third of it there already.
    at_chance = profile(prefix=(0.6, 0.9), other_position=(0.4, 0.1))
    at_chance.update(prefix_chance=torch.tensor((0.35, 0.2)), other_position_chance=torch.tensor((0.3, 0.5)))
    assert attention_role(at_chance) == (f"no role from demonstration queries; {ROLE_NAMES['prefix']} from target "
                                         "queries [demonstration: largest: prefix 0.60 (chance 0.35); target: "
                                         "prefix 0.90 (chance 0.20)]")  # fmt: skip
    no_demo_queries = {c: torch.tensor((math.nan, 0.9 if c == "same_position" else 0.0)) for c in CATEGORIES}
    assert attention_role(no_demo_queries) == f"{ROLE_NAMES['same_position']} [target: same_position 0.90]"
