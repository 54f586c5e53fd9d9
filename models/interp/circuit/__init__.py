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
  or on the runs (``greedy``); ``mean_se``, ``ratio_se``, ``beyond_2se``, ``roc_auc``.
- ``nodes``: node ablation, ``node_ablated_values`` and ``node_costs``; attribution of nodes,
  ``output_grads`` and ``node_attribution``.

Node ablation (``node_ablated_values``): every head and MLP outside a set of nodes set to its mean over
held-out contexts (``mean``) or its value on a fresh context of the task (``resample``), at every position:
the circuit's sufficiency, which does not depend on a corruption that keeps part of the context. With a
corruption's other contexts as the reference it is also the faithfulness of a circuit of nodes (every edge
among them kept): ``CircuitConfig.level`` ``"nodes"``, which ``auto`` chooses on a model of GPT-2 small's size.

Conventions. Scores are "noising" by default: ``score(edge) = metric(clean run, the edge's receiver seeing
its sender's ablated value) - metric(clean run)``; with the default metric (target NLL) a positive score is
a cost. The ablated value of a sender is its value in a run on other contexts (``CORRUPTIONS``: another
tree's demonstrations, the target re-drawn, fresh contexts) or its mean over held-out contexts.
"Denoising" (``denoising_runner``) is the mirror image: the base run is the corrupted one, an edge's
receiver sees its sender's clean value, and the metric is still that of the clean targets, so a negative
score restores what the corruption cost.
"""

from __future__ import annotations

from models.plumbing.lazy import lazy_names

_PUBLIC = {  # name -> the module that defines it; each is imported on first use (PEP 562), so that importing
    # the package (and models.interp.circuit.config, which the command line's --help reads) loads no torch
    "eap_ig_scores": "models.interp.circuit.attribution",
    "eap_scores": "models.interp.circuit.attribution",
    "input_grads": "models.interp.circuit.attribution",
    "CircuitConfig": "models.interp.circuit.config",
    "CORRUPTIONS": "models.interp.circuit.corruptions",
    "Corruption": "models.interp.circuit.corruptions",
    "denoising_runner": "models.interp.circuit.corruptions",
    "other_contexts": "models.interp.circuit.corruptions",
    "register_corruption": "models.interp.circuit.corruptions",
    "source_writes": "models.interp.circuit.corruptions",
    "check_fits": "models.interp.circuit.discovery",
    "discover": "models.interp.circuit.discovery",
    "exact_scores": "models.interp.circuit.exact",
    "Edge": "models.interp.circuit.graph",
    "Graph": "models.interp.circuit.graph",
    "INPUTS": "models.interp.circuit.graph",
    "Node": "models.interp.circuit.graph",
    "Receiver": "models.interp.circuit.graph",
    "Sender": "models.interp.circuit.graph",
    "build_graph": "models.interp.circuit.graph",
    "METHODS": "models.interp.circuit.methods",
    "ScoreMethod": "models.interp.circuit.methods",
    "register_method": "models.interp.circuit.methods",
    "NODE_ABLATIONS": "models.interp.circuit.nodes",
    "node_ablated_values": "models.interp.circuit.nodes",
    "node_costs": "models.interp.circuit.nodes",
    "node_attribution": "models.interp.circuit.nodes",
    "output_grads": "models.interp.circuit.nodes",
    "run_and_record": "models.interp.circuit.nodes",
    "node_outputs": "models.interp.circuit.nodes",
    "record_outputs": "models.interp.circuit.nodes",
    "CircuitResult": "models.interp.circuit.result",
    "Estimate": "models.interp.circuit.result",
    "DIRECTIONS": "models.interp.circuit.config",
    "Metric": "models.interp.circuit.runner",
    "ROWS": "models.interp.circuit.runner",
    "Runner": "models.interp.circuit.runner",
    "mean_writes": "models.interp.circuit.runner",
    "sender_writes": "models.interp.circuit.runner",
    "EdgeScores": "models.interp.circuit.scores",
    "curve_sizes": "models.interp.circuit.scores",
    "faithfulness": "models.interp.circuit.scores",
    "greedy": "models.interp.circuit.scores",
    "beyond_2se": "models.interp.circuit.scores",
    "mean_se": "models.interp.circuit.scores",
    "ratio_se": "models.interp.circuit.scores",
    "roc_auc": "models.interp.circuit.scores",
    "threshold": "models.interp.circuit.scores",
    "top_n": "models.interp.circuit.scores",
    "SEARCHES": "models.interp.circuit.search",
    "Search": "models.interp.circuit.search",
    "among": "models.interp.circuit.search",
    "register_search": "models.interp.circuit.search",
    "per_context_nll": "probes.metrics",
}
__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names(globals(), _PUBLIC)
