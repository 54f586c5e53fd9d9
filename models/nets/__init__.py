"""The networks, and nothing else: the hooked two-layer disentangled model (``causal_transformer``), its
continuous variant (``continuous``), the Theorem 1 construction (``theorem1``) and a standard decoder-only
transformer with TransformerLens hook names (``hooked_transformer``). A new architecture goes here; how it
is read from disk goes in ``models.loading``, how it is trained in ``models.training``."""
