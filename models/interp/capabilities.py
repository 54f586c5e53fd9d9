"""What a model family may have beyond the common interface of ``models.interp.subject.Subject``: each
family's ``capabilities`` is a set of these names, and an analysis declares the ones it needs (``REQUIRES``).
Strings only: an analysis's command line reads them before torch is imported."""

DISENTANGLED = "disentangled residual"  # [x_h, u_h^1..u_h^K] subspaces, blocks.1 bilinear W_KQ / W_OV
CONTENT_FREE_COPYERS = "content-free copyer layer"  # blocks.0 pattern is the same for every context
MARKOV_TASK = "Markov-tree task"  # discrete tokens with a kernel pi (BMA over parents applies)
BAYES_TASK = "task with a Bayes oracle"  # discrete tokens of the family, ours included (probes.oracles)
BILINEAR = "bilinear attention blocks"  # one W_KQ / A matrix per head over named residual blocks
