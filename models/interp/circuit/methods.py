"""Score methods: how each edge is scored. Each is one ``ScoreMethod`` in ``METHODS`` (``register_method``
adds one): exact edge patching, EAP, EAP-IG."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from models.interp.circuit.registry import Registry

if TYPE_CHECKING:  # the registry itself loads no torch: the command line's --help lists it before torch loads
    from models.interp.circuit.runner import Runner
    from models.interp.circuit.scores import EdgeScores


@dataclass(frozen=True)
class ScoreMethod:
    """One way to score every edge of a ``Runner``'s graph on each of its contexts: ``score(runner,
    config)`` -> ``EdgeScores`` ``[edge, context]`` (``config``: a ``CircuitConfig``, for the options the
    method reads); ``first_order``: the score is a first-order (gradient) estimate of the exact one."""

    name: str
    words: str
    score: Callable[[Runner, object], EdgeScores]
    first_order: bool = False


METHODS: Registry[ScoreMethod] = Registry("score method")
register_method = METHODS.register


def _exact(runner: Runner, config) -> EdgeScores:
    from tqdm.auto import tqdm

    from models.interp.circuit.exact import exact_scores

    return exact_scores(runner, progress=lambda e: tqdm(e, desc="exact edge patching", leave=False, disable=None))


register_method(ScoreMethod("exact", "exact edge patching: each edge ablated alone, the rest clean", _exact))
def _eap(runner: Runner, config) -> EdgeScores:
    from models.interp.circuit.attribution import eap_scores

    return eap_scores(runner)


def _eap_ig(runner: Runner, config) -> EdgeScores:
    from models.interp.circuit.attribution import eap_ig_scores

    return eap_ig_scores(runner, steps=config.ig_steps)


register_method(ScoreMethod("eap", "attribution patching: the gradient at the clean run times the sender's change",
                            _eap, first_order=True))  # fmt: skip
register_method(ScoreMethod("eap-ig", "EAP with integrated gradients over --ig-steps interpolations", _eap_ig,
                            first_order=True))  # fmt: skip
