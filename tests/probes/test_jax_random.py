"""Nichani et al.'s 20 DAGs, bit for bit: ``probes.jax_random`` (JAX's pre-0.5 threefry in NumPy) against
values JAX 0.4.30 printed, and the DAGs against their notebook's printed output. The suite needs no JAX."""

from __future__ import annotations

import numpy as np
import pytest

from probes import jax_random as R
from probes.graph_task import make_task

# Printed by JAX 0.4.30 (jax.random.split(PRNGKey(0)); bits, randint and bernoulli of PRNGKey(42)).
JAX_SPLIT_0 = [[4146024105, 967050713], [2718843009, 1272950319]]
JAX_BITS_42 = [3134548294, 3733159049, 843694964, 894150801, 801545058]
JAX_RANDINT_42 = [0, 0, 0, 1, 0, 1, 2, 3]  # randint(key, (8,), 0, arange(1, 9))
JAX_BERNOULLI_42 = [0, 0, 1, 0, 0, 1, 0, 1, 0, 0]  # bernoulli(key, 0.3, (10,))

# many_graphs.ipynb, the training cell's output: per DAG, `deltas[1:-1]` (positions 1..18) is nonzero
# exactly where the position has a parent (1 - the attention on it). Transcribed as masks.
NOTEBOOK_MASKS = """
011010011010100100 111010111000100110 001000100110110010 010110011101101010 000101100111001110
010010111000001010 011011000101000111 101011011101010111 000011011110101100 010010011011101001
010011100110100111 100111000110111100 001000010101000011 110111101110010011 010110001010001110
001100010010101110 010111111011011011 100110010100100111 000010001101000111 010100010011010111
""".split()

# The parents JAX 0.4.30 drew running their get_random_DAG on RNG(0).next(20) (their code, verbatim).
JAX_DAG_0 = [-1, -1, 0, 2, -1, 1, -1, -1, 6, 5, -1, 8, -1, 10, -1, -1, 7, -1, -1]
JAX_DAG_19 = [-1, -1, 1, -1, 1, -1, -1, -1, 6, -1, -1, 10, 5, -1, 7, -1, 13, 10, 1]


def test_threefry_primitives_match_jax():
    assert R.split(R.PRNGKey(0)).tolist() == JAX_SPLIT_0
    key = R.PRNGKey(42)
    assert R.random_bits(key, (5,)).tolist() == JAX_BITS_42
    assert R.randint(key, (8,), 0, np.arange(1, 9)).tolist() == JAX_RANDINT_42
    assert R.bernoulli(key, 0.3, (10,)).astype(int).tolist() == JAX_BERNOULLI_42


def test_the_twenty_dags_are_their_notebooks():
    dags = R.nichani_dags()
    assert len(dags) == 20 and dags[0] == JAX_DAG_0 and dags[19] == JAX_DAG_19
    masks = ["".join("1" if p >= 0 else "0" for p in dag[1:]) for dag in dags]
    assert masks == NOTEBOOK_MASKS
    assert all(0 <= p < i for dag in dags for i, p in enumerate(dag) if p >= 0)
    assert sum(p >= 0 for p in dags[0]) == 8  # their seed-0 DAG: 8 edges


def test_nichani_dag_task_kind():
    task = make_task("nichani_dag:index=0:kernel=dirichlet", 3, 0, 21, alpha=0.1)
    assert task.parents[:19] == [[] if p < 0 else [p] for p in JAX_DAG_0]
    assert task.parents[19:] == [[], [19]]  # their test token (a root) and its child, the target
    with pytest.raises(ValueError, match="index"):
        make_task("nichani_dag:index=20", 3, 0, 21)
