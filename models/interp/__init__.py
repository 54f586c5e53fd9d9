"""Interpretation: what the analyses do to a model. ``subject`` (``Subject``, the model under study as every
analysis sees it), ``interventions`` (interventions as data, corrupted contexts), ``patching`` (ready
TransformerLens patching sweeps), ``circuit`` (circuit discovery in one call, ``circuit.discover(subject, circuit.CircuitConfig(...))``, and a
package of one module per job: the graph, the shared forward pass, the corruptions, exact edge patching, EAP /
EAP-IG, the scores and searches, node ablation),
``path_patching`` (sender -> receiver path patching and dropping a demonstration from what heads read),
``baselines`` (BMA and the uniform-parent mixture on the same contexts, and a head's attention scored against
BMA's posterior) and ``inspection`` (``analyses.inspect``'s measurement: every number its report prints, as one
dict, with the thresholds behind its verdict). Measurement that needs no model goes in ``probes``; an
analysis's question, figures and summary in ``analyses``."""
