"""Side-by-side benchmark of the suite: ``python -m bench`` (see ``bench/__main__.py``).

``bench.reference`` holds the plain baselines it measures against: a copyer layer that materialises
the full ``((L+1)H) x ((L+1)H)`` score matrix per head, and Lemma 1 as a per-context loop.
"""

import models  # noqa: F401  (first: `python -m bench --help` answers there, before torch loads)
