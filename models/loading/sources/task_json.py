"""task.json: the task a model was trained on and where its input ids hold the task's tokens. Read and
validated here, once, for every format (our folders' ``task`` section included)::

    {"kind": "markov_tree",            # or "graph" (the task family, probes.graph_task), "continuous" (our folders only)
     "d_vocab": 5,                     # d, the task's vocabulary (task tokens 0..d-1); optional
     "n_examples": 6, "seq_len": 8,    # L demonstrations and H tokens per sequence
     "pi": [[...], ...],               # d x d row-stochastic kernel, pi[a][b] = pi(b | a)
     "root": [...],                    # optional distribution of x_1 (default uniform)
     "layout": {"order": "example-major", "bos": 0, "sep": 1, "token_offset": 2}}
                                       # optional; each key optional; or the legacy string "example-major..."

The fields' bounds are ``MarkovTreeTask.from_dict``'s (``probes.tasks``), the layout's ``Layout.from_json``'s. A
``graph`` task adds ``graph``, ``kernel``, ``parents``, ``alpha``, ``tables`` (``GraphTask.to_dict``); a file
without ``kind`` is our task.
"""

from __future__ import annotations

from models.plumbing.io import UsageError, one_line
from probes.continuous import ContinuousTask
from probes.graph_task import GraphTask
from probes.layout import Layout
from probes.tasks import MarkovTreeTask

KINDS = {"markov_tree": MarkovTreeTask, "graph": GraphTask, "continuous": ContinuousTask}


def read_task(
    raw, where: str, kinds=("markov_tree", "graph")
) -> tuple[MarkovTreeTask | GraphTask | ContinuousTask, Layout]:
    """(task, layout) from the schema above, with errors that name ``where`` (the file) and the field.
    ``kinds``: the task kinds this model may have."""
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: task must be a JSON object, got {type(raw).__name__}")
    kind = raw.get("kind", "markov_tree")
    if kind not in kinds:
        raise UsageError(f"{where}: task kind {kind!r} is not supported; expected {' or '.join(map(repr, kinds))}")
    try:
        task = KINDS[kind].from_dict(raw)
        return task, Layout.from_json(raw.get("layout"), task.n_examples, task.seq_len, task.d_vocab)
    except (TypeError, RuntimeError, KeyError) as e:  # e.g. a ragged pi list
        raise UsageError(f"{where}: malformed task ({one_line(e)})") from None
    except ValueError as e:
        raise UsageError(f"{where}: {e}") from None
