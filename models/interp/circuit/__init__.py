"""Circuit discovery on any subject: the graph of senders and receivers, exact edge patching, attribution
patching (EAP, EAP-IG), and the run of a circuit with every other edge ablated.

The graph (``build_graph``). Nodes: the token and position embeddings, each attention head, each MLP, the
output. An edge runs from a sender into one input of a later receiver (a head's query, key and value
inputs are separate receivers; an MLP's input; the output), at one group of positions (the positions'
role in the task: ``demonstrations``, ``target``, ``other`` for BOS and separators). For the disentangled
model the senders into layer 1 are the subspaces of its concatenated residual (subspace 0 the token,
subspace k+1 copyer k's write), so an edge there is exact, not a projection.

One mechanism for every family: a receiver is a pair of hooks, ``site`` (the residual it reads) and
``capture`` (its own activation, computed from that residual position by position or, for the content-free
copyers, from that residual alone). Editing a receiver's input = one pass with the edit at ``site`` in which
``capture`` is recorded, then the real pass with the recorded activation patched in
(``models.interp.interventions.Intervention``). That needs no split-input hooks (``use_split_qkv_input``), which a
TransformerBridge and our disentangled model do not offer in the same way; on the bridge the MLP's site is
``blocks.i.hook_resid_mid``, which there feeds only ln_2 (tests/models/interp/test_circuit.py checks every site and
capture per family, and that the bridge's resid_mid edit does not reach the residual stream).

Peer tools. auto-circuit (PyPI ``auto-circuit``) and the ACDC / EAP code bases build their graph by
patching a TransformerLens 2.x ``HookedTransformer`` with split q/k/v inputs (``use_split_qkv_input``). They
do run on our GPT-2 subjects, converted by hand to a TransformerLens 2.x HookedTransformer in an environment
of its own (docs/results/circuit.md says how): there auto-circuit 1.0.1 reproduced this module's exact and
EAP edge scores on the shipped GPT-2 to 3e-8, and the same circuit and faithfulness. They cannot run in
this suite's environment (TransformerLens >= 4.3, whose standard model is a TransformerBridge without
HookedTransformer's split inputs), nor on our disentangled model, whose residual is a concatenation whose
layers have different widths and head counts. ``transformer_lens.patching`` patches one activation per cell
and cannot express an edge (a sender's change seen by one receiver only). What we take from them: the
graph (senders, receivers with q/k/v apart), the scores (ACDC's edge ablation, EAP's gradient times the
change, EAP-IG's integrated gradients over the inputs), the searches and the JSON, and ROC AUC against
circuits known in advance.

The call (``discovery``): ``discover(subject, CircuitConfig(...)) -> CircuitResult`` scores, chooses and
answers in one go (``config``: every option, each documented; ``result``: the typed result, whose
``to_dict()`` is ``analyses.circuit``'s JSON). Where each piece lives (one module each; every name is
importable from ``models.interp.circuit``):
- ``graph``: ``Node`` (a typed node: ``str(node)`` is its label, ``Node.parse`` reads one), ``Edge``,
  ``Sender``, ``Receiver``, ``Graph``, ``build_graph``.
- ``runner``: the forward pass every method shares. ``Runner`` holds the base contexts, the senders' clean
  writes and ablated values and the metric, and runs the model with any set of edges ablated
  (``run_values``, ``keep_only_values``).
- ``registry``: ``Registry``, the one kind of registry of named objects below (an unknown name is a one-line
  ValueError listing the registered ones).
- ``corruptions``: ``Corruption`` and ``CORRUPTIONS`` (``register_corruption`` adds one): the senders'
  ablated values (``source_writes``, ``other_contexts``), and ``denoising_runner``, the mirror image.
- ``methods``: ``ScoreMethod`` and ``METHODS`` (exact, eap, eap-ig; ``register_method``).
- ``search``: ``Search`` and ``SEARCHES`` (top-n, threshold, greedy; ``register_search``), ``among``, ``ranked``.
- ``exact``: exact edge patching, ``exact_scores(runner)``.
- ``attribution``: EAP and EAP-IG, ``eap_scores(runner)`` and ``eap_ig_scores(runner, steps=...)``.
- ``scores``: ``EdgeScores``, what every method returns: each edge's score on each context, ``[edge,
  batch]``, keyed by edge (``scores[edge]``; ``means()`` is ``{Edge: float}``); what a circuit keeps
  (``faithfulness``, ``restored``); the searches' primitives on a score mapping (``top_n``, ``threshold``)
  or on the runs (``greedy``); ``mean_se``, ``ratio_se``, ``roc_auc``.
- ``nodes``: node ablation, ``node_ablated_values`` and ``node_costs``.

Node ablation (``node_ablated_values``): every head and MLP outside a set of nodes set to its mean over
held-out contexts (``mean``) or its value on a fresh context of the task (``resample``), at every position:
the circuit's sufficiency, which does not depend on a corruption that keeps part of the context.

Conventions. Scores are "noising" by default: ``score(edge) = metric(clean run, the edge's receiver seeing
its sender's ablated value) - metric(clean run)``; with the default metric (target NLL) a positive score is
a cost. The ablated value of a sender is its value in a run on other contexts (``CORRUPTIONS``: another
tree's demonstrations, the target re-drawn, fresh contexts) or its mean over held-out contexts.
"Denoising" (``denoising_runner``) is the mirror image: the base run is the corrupted one, an edge's
receiver sees its sender's clean value, and the metric is still that of the clean targets, so a negative
score restores what the corruption cost.
"""

from models.interp.circuit.attribution import eap_ig_scores, eap_scores, input_grads
from models.interp.circuit.config import CircuitConfig
from models.interp.circuit.corruptions import (
    CORRUPTIONS,
    Corruption,
    denoising_runner,
    other_contexts,
    register_corruption,
    source_writes,
)
from models.interp.circuit.discovery import check_fits, discover
from models.interp.circuit.exact import exact_scores
from models.interp.circuit.graph import INPUTS, Edge, Graph, Node, Receiver, Sender, build_graph
from models.interp.circuit.methods import METHODS, ScoreMethod, register_method
from models.interp.circuit.nodes import (
    NODE_ABLATIONS,
    node_ablated_values,
    node_costs,
    node_outputs,
    record_outputs,
)
from models.interp.circuit.result import CircuitResult, Estimate
from models.interp.circuit.runner import DIRECTIONS, ROWS, Metric, Runner, mean_writes, sender_writes
from models.interp.circuit.scores import (
    EdgeScores,
    curve_sizes,
    faithfulness,
    greedy,
    mean_se,
    ratio_se,
    roc_auc,
    threshold,
    top_n,
)
from models.interp.circuit.search import SEARCHES, Search, among, register_search
from probes.metrics import per_context_nll

__all__ = [
    "CORRUPTIONS", "DIRECTIONS", "INPUTS", "METHODS", "NODE_ABLATIONS", "ROWS", "SEARCHES", "CircuitConfig",
    "CircuitResult", "Corruption", "Edge", "EdgeScores", "Estimate", "Graph", "Metric", "Node", "Receiver", "Runner",
    "ScoreMethod", "Search", "Sender", "among", "build_graph", "check_fits", "curve_sizes", "denoising_runner",
    "discover", "eap_ig_scores", "eap_scores", "exact_scores", "faithfulness", "greedy", "input_grads", "mean_se",
    "mean_writes", "node_ablated_values", "node_costs", "node_outputs", "other_contexts", "per_context_nll",
    "ratio_se", "record_outputs", "register_corruption", "register_method", "register_search", "roc_auc",
    "sender_writes", "source_writes", "threshold", "top_n",
]  # fmt: skip
