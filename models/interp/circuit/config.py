"""What ``discover`` is asked to do: ``CircuitConfig``, every option of ``python -m analyses.circuit``
with the same default. A name that no registry knows (a corruption, a method, a search) and a value out of
its range are refused when the config is built, in one line naming the field."""

from __future__ import annotations

from models.interp.circuit.corruptions import CORRUPTIONS
from models.interp.circuit.methods import METHODS
from models.interp.circuit.search import SEARCHES
from models.plumbing.config import MAX_CONTEXTS, MAX_SEED, Config, option

DIRECTIONS = ("noising", "denoising")  # an edge's receiver sees the ablated value in the clean run, or the reverse
LEVELS = ("auto", "edges", "nodes")  # what the circuit is made of: edges, or nodes with every edge among them
POSITIONS = ("trained", "all", "last")  # the targets every NLL averages over (probes.metrics.scored_rows), or those the model was trained on

MAX_CURVE_POINTS = 1000  # circuit sizes on the curve; each is one ablated run over every context
MAX_IG_STEPS = 1024  # EAP-IG converges by 8 on the standard GPT-2 (README: Circuit discovery)
MIN_HELD_OUT, MAX_HELD_OUT = 512, 8192  # the held-out sample's bounds; its size in between is the first 512's estimate
# teraFLOPs (counted from the weights: 2 x the blocks' parameters x positions x contexts per run) that exact edge
# patching, and the whole search at the level of edges, may take (``discovery.edge_level_work``): beyond the first the
# edges are ranked by EAP-IG, beyond the second (auto) the circuit is one of nodes. One core runs about 20 GFLOP/s on
# these models, so the default is minutes. The shipped GPT-2's default search counts 4.2 TFLOP (1.64 of them exact
# patching); a planted 4-layer, 8-head, width-64 GPT-2's 25 TFLOP (about 18 minutes measured at the level of edges);
# a GPT-2-small-shaped model's 23,700.
EXACT_BUDGET = 6.0
DEFAULT_CORRUPTIONS = (
    "demonstrations",
    "mean",
)  # the task's corruption, and mean ablation (which sees the target side)


def _doc(default, text: str, **accepts):
    """A field with its default, its sentence (the command line's ``--help``) and what it accepts (``option``)."""
    return option(default, text, **accepts)


class CircuitConfig(Config):
    """Every option of circuit discovery (``discover``); each field's ``metadata["help"]`` says what it does,
    and is the ``--help`` of its flag in ``python -m analyses.circuit``. Checked where it is made (types, ranges,
    names: ``models.plumbing.config``)."""

    n_contexts: int = _doc(128, "contexts the search scores the edges on (each exact edge score is one forward "
                                "pass on all of them)", minimum=2, maximum=MAX_CONTEXTS)  # fmt: skip
    seed: int = _doc(0, "seed of everything random: the search contexts, the corruptions, the held-out samples",
                     minimum=0, maximum=MAX_SEED)  # fmt: skip
    method: str = _doc("exact", "how each edge is scored: exact path patching, or attribution patching (EAP, EAP-IG)",
                       choices=tuple(METHODS))  # fmt: skip
    corruptions: tuple[str, ...] = _doc(DEFAULT_CORRUPTIONS, "the senders' ablated values, comma-separated: the "
                                        "circuit is the union of the circuits each finds ("
                                        + "; ".join(f"{k}: {c.words}" for k, c in CORRUPTIONS.items()) + ")",
                                        sep=",", flag="corruption")  # fmt: skip
    min_z: float = _doc(2.0, "edges whose |score| exceeds this many standard errors come first in the top-n order",
                        minimum=0)  # fmt: skip
    n_held_out: int | None = _doc(None, "fresh contexts for the held-out answers (default: the number whose "
                                        "progress SE is --target-se, estimated from the spread of the progress over "
                                        f"the first {MIN_HELD_OUT} of them, at least {MIN_HELD_OUT}, at most "
                                        f"{MAX_HELD_OUT})",
                                  minimum=2, maximum=MAX_CONTEXTS)  # fmt: skip
    target_se: float = _doc(0.01, "the standard error of the model's progress that the held-out sample must reach")
    direction: str = _doc("noising", "noising: an edge's receiver sees the ablated value in the clean run; "
                                     "denoising: it sees the clean value in the corrupted run (a circuit found by "
                                     "denoising is judged by noising and by denoising)", choices=DIRECTIONS)  # fmt: skip
    search: str = _doc("top-n", "how the circuit is chosen from the scores: top-n edges, a score threshold, or "
                                "greedy ACDC-style pruning", choices=tuple(SEARCHES))  # fmt: skip
    n_edges: int | None = _doc(None, "top-n: keep this many edges (default: the fewest that keep --target)",
                               minimum=0)  # fmt: skip
    target: float = _doc(0.9, "top-n without --n-edges: the share of the model's progress the circuit must keep")
    threshold: float | None = _doc(None, "threshold / greedy: keep edges whose |score| exceeds this (default: 1e-3)")
    nodes: tuple[str, ...] | None = _doc(None, "score a given circuit instead of searching: every edge among these "
                                               "comma-separated nodes (L1H2,MLP0,...)", sep=",")  # fmt: skip
    curve_points: int = _doc(8, "number of non-empty circuit sizes on the faithfulness curve, which also plots the "
                                f"empty circuit (0 edges), at most {MAX_CURVE_POINTS}", minimum=1,
                                maximum=MAX_CURVE_POINTS)  # fmt: skip
    ig_steps: int = _doc(8, f"EAP-IG: interpolation steps between the clean and corrupted runs, at most {MAX_IG_STEPS}",
                         minimum=1, maximum=MAX_IG_STEPS)  # fmt: skip
    exact_budget: float = _doc(EXACT_BUDGET, "teraFLOPs (10^12 floating-point operations) that exact edge patching "
                                             "may take, counted from the weights before it starts (the same on every "
                                             "machine): beyond it, the edges are ranked by EAP-IG instead (said in the "
                                             "summary and the JSON; the circuit chosen is still judged by exact runs); "
                                             "--level auto compares the whole edge-level search with it, and at the "
                                             "level of nodes half of it sets how many nodes are measured exactly",
                               minimum=0)  # fmt: skip
    level: str = _doc("auto", "what the circuit is chosen as: edges (scored one by one), or nodes (heads and MLPs, "
                              "with every edge among them: each answer is then one run of the contexts); auto: edges, "
                              "unless the search at the level of edges (scores, node costs, curves and searches) is "
                              "counted beyond --exact-budget (a model deeper or wider than the shipped ones)",
                      choices=LEVELS)  # fmt: skip
    positions: str = _doc("trained", "the target positions every NLL averages over: trained (those the model's loss "
                                     "used: the last token for a CatFormer or a model trained with --loss-on last, "
                                     "else all; the result records which), all (every h >= 1) or last",
                                     choices=POSITIONS)  # fmt: skip

    def __post_init__(self):
        """Strings split as the command line writes them ("demonstrations,mean"), then every field checked."""
        if isinstance(self.corruptions, str):  # "demonstrations,mean", as the command line writes it
            object.__setattr__(self, "corruptions", tuple(c.strip() for c in self.corruptions.split(",") if c.strip()))
        object.__setattr__(self, "corruptions", tuple(self.corruptions))
        if isinstance(self.nodes, str):
            object.__setattr__(self, "nodes", tuple(n.strip() for n in self.nodes.split(",") if n.strip()))
        super().__post_init__()

    def validate(self) -> None:
        """One-line ValueError, its leading word the field, for the first option out of its range."""
        bad = [c for c in self.corruptions if c not in CORRUPTIONS]
        if bad or not self.corruptions or len(set(self.corruptions)) != len(self.corruptions):
            raise ValueError(f"corruptions: expected distinct names among {', '.join(CORRUPTIONS)}, comma-separated; "
                             f"got {','.join(self.corruptions)!r}")  # fmt: skip
        for name, registry in (("method", METHODS), ("search", SEARCHES), ("direction", DIRECTIONS), ("positions", POSITIONS),
                               ("level", LEVELS)):
            if getattr(self, name) not in registry:
                raise ValueError(f"{name}: expected one of {', '.join(registry)}, got {getattr(self, name)!r}")
        if self.direction == "denoising":
            averaged = [c for c in self.corruptions if not CORRUPTIONS[c].can_denoise]
            if averaged:
                raise ValueError(f"direction denoising needs a corruption that is a run on other contexts, not "
                                 f"{', '.join(averaged)}")  # fmt: skip
        if self.level == "nodes" and self.n_edges is not None:
            raise ValueError(f"n_edges {self.n_edges} applies to a circuit of edges; at level nodes every edge among the "
                             "nodes is kept: use --level edges, or leave --n-edges out")  # fmt: skip
        if self.level == "nodes" and self.direction == "denoising":
            raise ValueError("level nodes judges a circuit by noising only: use --direction noising, or --level edges")
        for name, low, high in (("n_contexts", 2, None), ("curve_points", 1, MAX_CURVE_POINTS),
                                ("ig_steps", 1, MAX_IG_STEPS), ("n_held_out", 2, None), ("n_edges", 0, None)):  # fmt: skip
            value = getattr(self, name)
            if value is not None and value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
            if value is not None and high is not None and value > high:
                raise ValueError(f"{name} must be <= {high}, got {value}")
        if not self.target_se > 0:
            raise ValueError(f"target_se must be > 0, got {self.target_se}")
        if not 0 < self.target <= 1:
            raise ValueError(f"target must be a share of the model's progress in (0, 1], got {self.target}")
        if self.threshold is not None and not self.threshold >= 0:
            raise ValueError(f"threshold must be >= 0 (it bounds |score|), got {self.threshold}")
        if self.nodes is not None and not self.nodes:
            raise ValueError("nodes: expected at least one node (L1H2,MLP0,...), got none")
        if self.nodes is not None:
            from models.interp.circuit.graph import Node  # here: the config (the command line's --help) loads no torch

            for n in self.nodes:
                Node.parse(n)  # the label's form; whether the model has it is checked against its graph
