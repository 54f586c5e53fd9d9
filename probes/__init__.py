"""Tasks (ours and the family, ``probes.graph_task``), the BMA and Bayes oracles (``probes.oracles``) and
measurements (see ``probes.tasks`` for the token layout)."""

from probes.bma import bma_log_posterior, bma_posterior, bma_predictive, bma_scores, check_tokens
from probes.graph_task import GraphTask, make_task
from probes.layout import Layout
from probes.metrics import (
    copy_mass,
    demonstration_mass,
    head_assignment,
    mean_tv,
    parent_accuracy,
    target_nll,
    total_variation,
)
from probes.oracles import bayes, distances, strategies
from probes.tasks import MarkovTreeTask, dirichlet_kernel

__all__ = [
    "GraphTask",
    "Layout",
    "MarkovTreeTask",
    "bayes",
    "bma_log_posterior",
    "bma_posterior",
    "bma_predictive",
    "bma_scores",
    "check_tokens",
    "copy_mass",
    "demonstration_mass",
    "dirichlet_kernel",
    "distances",
    "head_assignment",
    "make_task",
    "mean_tv",
    "parent_accuracy",
    "strategies",
    "target_nll",
    "total_variation",
]
