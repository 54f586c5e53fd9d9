"""``--checkpoint theorem1:beta=B[,from=FOLDER]``: the Theorem 1 construction on a folder's task (default:
the shipped checkpoint's). Not a file format: a spec, read before any path is looked at."""

from __future__ import annotations

import hashlib

from models.loading.named import THEOREM1, THEOREM1_USAGE
from models.loading.sources.files import Source
from models.nets.theorem1 import MAX_BETA, theorem1_model
from models.plumbing.io import UsageError
from probes.layout import Layout
from probes.tasks import MarkovTreeTask

NAME, USAGE = THEOREM1, THEOREM1_USAGE


def detect(spec: str) -> bool:
    return spec.startswith(NAME)


def parse(spec: str) -> dict:
    """The options of ``spec`` (``beta``, ``from``), validated; one line naming the usage otherwise."""
    head, _, rest = spec.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in ("beta", "from"):
            raise UsageError(f"bad --checkpoint {spec!r}; expected {USAGE}")
        options[key] = value
    if head != NAME:
        raise UsageError(f"bad --checkpoint {spec!r}; expected {USAGE}")
    try:
        beta = float(options.get("beta", 50))
    except ValueError:
        beta = float("nan")
    if not 0 < beta <= MAX_BETA:
        raise UsageError(f"bad beta in --checkpoint {spec!r}; expected a number in (0, {MAX_BETA:g}]")
    return options


def read(spec: str, task, device: str | None = None) -> Source:
    """The construction (float64) on ``task``, the task of ``parse(spec)``'s ``from`` folder."""
    if not isinstance(task, MarkovTreeTask):
        raise UsageError(f"--checkpoint {spec}: Theorem 1 needs a Markov-tree task, the folder's task is continuous")
    beta = float(parse(spec).get("beta", 50))
    model = theorem1_model(task.pi, task.n_examples, task.seq_len, beta, task.root).to(device or "cpu")
    digest = hashlib.sha256(f"{spec}|{task.pi.tolist()}".encode()).hexdigest()[:16]
    return Source(model, task, Layout(task.n_examples, task.seq_len, task.d_vocab), spec, digest, NAME)
