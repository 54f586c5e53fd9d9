"""Tasks, the BMA oracle and measurements (see ``probes.tasks`` for the token layout)."""

from probes.bma import bma_log_posterior, bma_posterior, bma_predictive, bma_scores, check_tokens
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
from probes.tasks import MarkovTreeTask, dirichlet_kernel

__all__ = [
    "Layout",
    "MarkovTreeTask",
    "bma_log_posterior",
    "bma_posterior",
    "bma_predictive",
    "bma_scores",
    "check_tokens",
    "copy_mass",
    "demonstration_mass",
    "dirichlet_kernel",
    "head_assignment",
    "mean_tv",
    "parent_accuracy",
    "target_nll",
    "total_variation",
]
