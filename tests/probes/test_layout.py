"""probes.layout: positions, encoding and task.json parsing, against a context assembled id by id."""

from __future__ import annotations

import itertools

import pytest
import torch

from probes.layout import Layout


def assemble(tokens: list[int], L: int, H: int, bos, sep, offset: int) -> tuple[list[int], dict, list]:
    """Brute force: the input ids written one at a time, where each task token (l, h) landed, and what
    each position holds ((l, h) or None for BOS/separators)."""
    ids, where, holds = [], {}, []
    if bos is not None:
        ids.append(bos)
        holds.append(None)
    for l in range(L + 1):
        for h in range(H):
            where[l, h] = len(ids)
            ids.append(tokens[l * H + h] + offset)
            holds.append((l, h))
        if sep is not None and l < L:
            ids.append(sep)
            holds.append(None)
    return ids, where, holds


CASES = [
    (L, H, bos, sep, offset)
    for L, H in ((1, 2), (3, 4))
    for bos, sep, offset in ((None, None, 0), (0, None, 1), (None, 0, 1), (0, 1, 2), (7, 6, 0), (None, None, 3))
]


@pytest.mark.parametrize("L,H,bos,sep,offset", CASES)
def test_positions_and_encode_match_a_context_assembled_by_hand(L, H, bos, sep, offset):
    d = 3
    layout = Layout(L, H, d, bos=bos, sep=sep, token_offset=offset)
    g = torch.Generator().manual_seed(L * 10 + H)
    tokens = torch.randint(0, d, (5, (L + 1) * H), generator=g)
    encoded = layout.encode(tokens)
    for b in range(5):
        ids, where, holds = assemble(tokens[b].tolist(), L, H, bos, sep, offset)
        assert encoded[b].tolist() == ids
        assert layout.n_positions == len(ids)
    specials = [v for v in (bos, sep) if v is not None]
    assert layout.min_vocab == max([*specials, offset + d - 1]) + 1  # the largest id any context can hold, + 1
    pos = layout.token_positions()
    for l, h in itertools.product(range(L + 1), range(H)):
        assert pos[l, h].item() == where[l, h]
    # The ordinary shift: the logits at p predict the id at p + 1, so x_h of the target is predicted at
    # the position just before it (for h = 0: the last id before the target, a separator if there is one).
    assert layout.prediction_positions().tolist() == [where[L, h] - 1 for h in range(H)]
    keys = layout.key_tokens()
    assert [None if k[0] < 0 else tuple(k) for k in keys.tolist()] == holds


def test_plain_layout_is_the_identity():
    layout = Layout(3, 4, 5)
    tokens = torch.randint(0, 5, (2, 16))
    assert layout.is_plain and torch.equal(layout.encode(tokens), tokens)
    assert layout.n_positions == 16 and layout.min_vocab == 5


@pytest.mark.parametrize(
    "raw,message",
    [
        ({"bos": 2, "token_offset": 0}, "collides"),
        ({"sep": -1}, "token id >= 0"),
        ({"token_offset": -2}, "token_offset"),
        ({"order": "position-major"}, "order"),
        ({"eos": 3}, "unknown layout keys"),
        ("position-major", "layout must be"),
        ({"bos": True}, "token id"),
    ],
)
def test_bad_layouts_are_one_line_errors(raw, message):
    with pytest.raises(ValueError, match=message) as err:
        Layout.from_json(raw, 2, 3, 4)
    assert "\n" not in str(err.value)


def test_json_round_trip_and_legacy_string():
    layout = Layout(2, 3, 4, bos=0, sep=1, token_offset=2)
    assert Layout.from_json(layout.to_json(), 2, 3, 4) == layout
    assert Layout.from_json("example-major: flat index l*H + h", 2, 3, 4) == Layout(2, 3, 4)
    assert Layout.from_json(None, 2, 3, 4) == Layout(2, 3, 4)
