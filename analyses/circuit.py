"""Circuit discovery: which nodes and edges of the model's graph carry the task? Scores every edge under
each corruption, chooses the nodes and the edges, and answers two questions on held-out contexts.

    python -m analyses.circuit --checkpoint standard                 # the shipped standard GPT-2
    python -m analyses.circuit --checkpoint default --method eap-ig  # attribution patching
    python -m analyses.circuit --checkpoint theorem1:beta=50 --corruption mean

The computation is one library call, ``models.interp.circuit.discover(subject, CircuitConfig(...))``, whose
config has a field for each flag below (its docstring says where the peer tools run); this module turns the
flags into that config, the result into words and figures.
Nodes: embeddings, heads, MLPs, the output; an edge enters one input of a receiver (a head's q, k or v; an
MLP; the output) at one group of positions (demonstrations, target, other). Scores (``--method``): exact
edge patching (each edge ablated alone, the rest clean) or EAP / EAP-IG. Ablated values (``--corruption``,
comma-separated; default ``demonstrations,mean``): the sender's value on contexts whose demonstrations come
from another tree (``demonstrations``, the task's own corruption: it keeps the target, so it cannot see what
reads only the target's own prefix), whose target tokens are re-drawn (``target``), on fresh contexts
(``resample``), or its mean over held-out contexts (``mean``, which sees both sides). Direction
(``--direction``): noising or denoising. Every score is a mean over the contexts with its standard error.
Metric: target NLL. Progress = (plateau NLL - NLL) / (plateau NLL - BMA NLL), the plateau being
uniform-parent BMA.

The circuit (default search): its NODES are every head or MLP whose mean ablation alone costs more than
3 standard errors, then the costliest others until the nodes alone, every other head and MLP mean-ablated,
keep ``--target`` of the progress, then, for each corruption under which the edges among them keep less,
the nodes its edge scores weigh most. Its EDGES, for each corruption, are the smallest top-n among the
edges between those nodes (edges whose |score| exceeds ``--min-z`` standard errors first) keeping
``--target``; the circuit's edges are their union. ``--n-edges`` / ``--threshold`` / ``--search greedy`` /
``--nodes`` choose otherwise. Exact patching that would take more than ``--exact-budget`` teraFLOPs
(counted from the weights, the same on every machine: a graph of a GPT-2-small-sized model) is replaced by
EAP-IG to rank the edges, said in the summary and the JSON; the nodes and the circuit are still chosen and judged by exact
runs. Where the whole search at the level of edges (the scores, the node costs, the curves and searches) is
counted beyond that budget, or the edge-level answers would not fit in memory (``--level auto``; ``--level nodes``
asks for it), the circuit is chosen as NODES: heads and MLPs ranked by attribution (each one's mean ablation to
first order, one backward pass), the first ranked measured exactly (as many as half the budget allows), chosen
by the rules above with node-level runs (a share within 2 SE of the target counts as kept); every stage runs the
contexts a part at a time, so memory does not grow with their number. Its edges are scored by EAP (shown where
beyond 2 SE) and, where what the budget leaves allows, pruned by the search among the nodes (every other head and
MLP held at its ablated value); else every edge among its nodes is kept, and ablating every other edge is one run
with every other head and MLP at its ablated value: each answer is one exact run, and
faithfulness under ``mean`` is then mean-ablation sufficiency. It has no faithfulness curve. The two answers, on ``--n-held-out`` fresh contexts the search never saw (default: as many as give
the progress a standard error of ``--target-se``, estimated from its spread over the search contexts; at
least 512), and again on as many other fresh contexts:
- faithfulness under each corruption: the share of the progress its edges keep with every other edge at
  its ablated value; under ``demonstrations`` it says the circuit CARRIES THE DEMONSTRATIONS' EVIDENCE;
- sufficiency: the share its nodes alone keep with every other head and MLP mean-ablated (or resampled from
  fresh contexts of the task): the circuit COMPUTES THE PREDICTION.
A circuit found by denoising is also judged by its denoising faithfulness, the share of the clean-minus-
corrupted NLL it recovers when the corrupted run has only its edges restored. The faithfulness curve keeps
the top-n edges of the whole graph for n along the way, on the search contexts. A share is printed only where
its denominator is beyond 2 standard errors of zero: a model whose progress on the search contexts is not
gets one line saying so, and no circuit (exit 0; the JSON's ``refused`` says why).
"""

from __future__ import annotations

import dataclasses
import sys

from analyses import common
from models.interp.circuit.config import CircuitConfig  # the flags: no torch before they are parsed
from models.plumbing.io import UsageError

NAME = "circuit"
REQUIRES = frozenset({common.MARKOV_TASK})  # what it needs of its subject
Config = CircuitConfig  # the library's config: a flag per field (models.interp.circuit.config)


common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

from models.interp.circuit import discover as find_circuit
from models.interp.circuit import report
from models.interp.circuit.report import answers, summary  # noqa: F401 (the summary hook; answers, for tests)
from models.interp.subject import Subject
from models.training.optim import keep_freed_memory

PAPER_ARGS = ["--checkpoint", "standard"]  # the committed figures/circuit*: the shipped GPT-2's circuit
QUICK_CONFIG = {"n_held_out": 16}  # tests/analyses/test_every_family.py: the held-out sample at a quick size
FIGURES = {
    "circuit_graph.png": "the discovered circuit: nodes by layer, each kept edge coloured by the input it enters (q, k, v, MLP, output), drawn by position group, width by |score|.",
    "circuit_curve.png": "faithfulness (share of the full model's progress over the uniform-parent plateau kept) against the number of edges kept, top-n by |score|, with standard errors (denoising: also the share of the clean-minus-corrupted NLL recovered with only those edges restored); for a circuit of nodes, which has none, a note saying why.",
}
def compute(subject: Subject, config: Config) -> dict:
    """``discover`` with the flags' config; its result as the JSON records it. A library error about a
    config field (a node the model lacks, sizes that do not fit) names the field's flag. The process keeps
    the memory it frees (``keep_freed_memory``): its passes ask for the same buffers again and again, and
    mapping them afresh cost a fifth of exact patching's CPU time (measured on the shipped GPT-2)."""
    keep_freed_memory()
    try:
        found = find_circuit(subject, config)
        print("circuit: seconds each stage took (the work counted before it is in the summary): "  # on stderr: not
              + ", ".join(f"{k} {wall:.0f}" for k, (wall, _) in found.timings.items()), file=sys.stderr)  # a number
        return found.to_dict()
    except ValueError as e:  # about a field (a node the model lacks, sizes that do not fit): bad input, not a bug
        if str(e).split(" ")[0].rstrip(":") not in {f.name for f in dataclasses.fields(CircuitConfig)}:
            raise
        raise UsageError(str(e)) from e


def figures(result: common.Result) -> dict:
    """The circuit's graph and its faithfulness curve (``models.interp.circuit.report.figures``)."""
    return report.figures(result.data, result.title)


def record(r: dict) -> dict:
    return r


ANALYSIS = common.register(globals())
