"""JAX's random numbers as JAX before 0.5 draws them (threefry2x32, ``jax_threefry_partitionable`` off),
in NumPy: enough of ``jax.random`` (``PRNGKey``, ``split``, ``randint``, ``bernoulli``) to redraw
Nichani et al.'s 20 DAGs bit for bit without JAX (``nichani_dags``). Written from JAX's published
algorithm (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"; ``jax._src.prng``) and
checked against JAX 0.4.30 (tests/probes/test_jax_random.py; its expected values were printed by that JAX).

A key is a ``uint32[2]`` array.
"""

from __future__ import annotations

import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(key: np.ndarray, x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 20-round Threefry-2x32 block cipher of ``key`` on the counter pairs ``(x0, x1)`` (uint32)."""
    k0, k1 = np.uint32(key[0]), np.uint32(key[1])
    ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    x0, x1 = x0.astype(np.uint32) + ks[0], x1.astype(np.uint32) + ks[1]
    with np.errstate(over="ignore"):
        for i in range(5):
            for r in _ROTATIONS[i % 2]:
                x0 = x0 + x1
                x1 = _rotl(x1, r) ^ x0
            x0 = x0 + ks[(i + 1) % 3]
            x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _threefry_2x32(key: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``jax.prng.threefry_2x32``: the counts split in halves (padded to even), enciphered, rejoined."""
    flat = count.ravel().astype(np.uint32)
    odd = flat.size % 2
    if odd:
        flat = np.concatenate([flat, np.zeros(1, np.uint32)])
    half = flat.size // 2
    y0, y1 = threefry2x32(key, flat[:half], flat[half:])
    out = np.concatenate([y0, y1])
    return (out[:-1] if odd else out).reshape(count.shape)


def PRNGKey(seed: int) -> np.ndarray:
    """``jax.random.PRNGKey(seed)`` for a seed below 2^32: ``[0, seed]``."""
    return np.array([(seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF], dtype=np.uint32)


def split(key: np.ndarray, num: int = 2) -> np.ndarray:
    """``jax.random.split(key, num)``: ``[num, 2]`` keys."""
    return _threefry_2x32(key, np.arange(num * 2, dtype=np.uint32)).reshape(num, 2)


def random_bits(key: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """32 random bits per entry of ``shape`` (``jax.random.bits`` at 32 bits)."""
    size = int(np.prod(shape))
    return _threefry_2x32(key, np.arange(size, dtype=np.uint32)).reshape(shape)


def randint(key: np.ndarray, shape: tuple[int, ...], minval, maxval) -> np.ndarray:
    """``jax.random.randint`` (int32; bounds inside int32): two words of bits, reduced modulo the span."""
    k1, k2 = split(key)
    hi, lo = random_bits(k1, shape), random_bits(k2, shape)
    minval = np.broadcast_to(np.asarray(minval, np.int64), shape)
    maxval = np.broadcast_to(np.asarray(maxval, np.int64), shape)
    span = np.where(maxval <= minval, 1, maxval - minval).astype(np.uint64)
    mult = (np.uint64(2**16) % span) ** 2 % span
    offset = ((hi.astype(np.uint64) % span) * mult % 2**32 + lo.astype(np.uint64) % span) % 2**32 % span
    return (minval + offset.astype(np.int64)).astype(np.int32)


def uniform(key: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``jax.random.uniform`` in float32 on [0, 1): 23 mantissa bits under an exponent of 1, minus 1."""
    bits = (random_bits(key, shape) >> np.uint32(9)) | np.uint32(0x3F800000)
    return bits.view(np.float32) - np.float32(1.0)


def bernoulli(key: np.ndarray, p: float, shape: tuple[int, ...]) -> np.ndarray:
    """``jax.random.bernoulli`` (float32 uniforms below p)."""
    return uniform(key, shape) < np.float32(p)


def nichani_dags(n: int = 20, seed: int = 0, seq_len: int = 20, p: float = 0.5) -> list[list[int]]:
    """The DAGs of Nichani et al.'s ``many_graphs.ipynb``: ``rng = RNG(seed)``, ``keys = rng.next(n)``,
    then ``get_random_DAG(key, p)`` for each: position i in 1..seq_len-2 draws a parent ``randint(0, i)``
    and drops it with probability p; position 0 has none. Returns n lists of seq_len - 1 parents (-1: a
    root), their ``problem.dag``; their sequence appends the test token at seq_len - 1."""
    _, sub = split(PRNGKey(seed))  # RNG.next(): the state key advances, the other half is used
    out = []
    for key in split(sub, n):
        key, subkey = split(key)
        dag = np.concatenate([[-1], randint(key, (seq_len - 2,), 0, np.arange(1, seq_len - 1))])
        mask = bernoulli(subkey, p, (seq_len - 1,))
        out.append(np.where(mask == 0, dag, -1).astype(int).tolist())
    return out
