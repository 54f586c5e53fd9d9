"""The node search's doubling-then-bisecting choice (``discovery.fewest_first``) against adding the nodes one at a
time (the search it replaced), on share sequences drawn at random: the same nodes wherever the share grows as
nodes are added, in at most about 2 log2(k) runs where one at a time takes k + 1."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from models.interp.circuit.discovery import fewest_first
from models.interp.circuit.result import Estimate

TARGET = 0.9


def one_at_a_time(candidates, share_of, kept) -> list:
    """The search before: check the nodes so far, add the next while they fall short."""
    added = []
    for n in candidates:
        if kept(share_of(added)):
            break
        added.append(n)
    return added


def shares_of(values: list[float]):
    """``share_of(prefix)`` reading the share of a prefix of length k from ``values[k]``, and the lengths asked."""
    asked = []

    def share_of(prefix):
        asked.append(len(prefix))
        return Estimate(values[len(prefix)], 0.01)

    return share_of, asked


def kept(share: Estimate) -> bool:
    return share.value >= TARGET


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0, 0.2), min_size=1, max_size=60), st.floats(-1.5, 0.5))
def test_the_same_nodes_as_one_at_a_time_where_the_share_grows(steps, start):
    values = [start + sum(steps[:k]) for k in range(len(steps) + 1)]  # non-decreasing in the prefix's length
    candidates = [f"N{i}" for i in range(len(steps))]
    share_of, asked = shares_of(values)
    chosen = fewest_first(candidates, share_of, kept, lambda share, before: f"{before}: {share.value:.3f}")
    expected = one_at_a_time(candidates, shares_of(values)[0], kept)
    assert list(chosen) == expected
    k = len(expected)
    assert len(asked) <= (2 * math.ceil(math.log2(k)) + 2 if k else 1)
    assert len(set(asked)) == len(asked)  # no prefix measured twice


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=2, max_size=40))
def test_any_sequence_gives_a_prefix_that_keeps_the_target_after_one_that_falls_short(values):
    candidates = [f"N{i}" for i in range(len(values) - 1)]
    share_of, asked = shares_of(values)
    chosen = list(fewest_first(candidates, share_of, kept, lambda share, before: before))
    k = len(chosen)
    assert chosen == candidates[:k]
    if k:  # the prefix just short of it was measured and falls short; the chosen one keeps it (or is every node)
        assert k - 1 in asked and values[k - 1] < TARGET
        assert values[k] >= TARGET or k == len(candidates)
    else:
        assert values[0] >= TARGET


def test_each_reason_names_the_longest_prefix_measured_up_to_it():
    values = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.95, 0.97]  # 8 needed: 0, 1, 2, 4 short, 8 keeps, 6, 7 short
    candidates = [f"N{i}" for i in range(9)]
    share_of, asked = shares_of(values)
    reasons = fewest_first(candidates, share_of, kept, lambda share, before: f"before {before}: {share.value:.2f}")
    assert asked == [0, 1, 2, 4, 8, 6, 7] and list(reasons) == candidates[:8]
    assert reasons["N0"] == "before it: 0.10" and reasons["N4"] == "before it: 0.50"
    assert reasons["N3"].startswith("before N2: 0.30 (the nodes from there to it not measured alone")
    assert reasons["N5"].startswith("before N4: 0.50 (")
