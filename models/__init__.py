"""The hooked two-layer model, Theorem 1, checkpoints (training: ``python -m models.train``)."""

from pathlib import Path

from models.causal_transformer import CausalTransformer, CausalTransformerConfig
from models.checkpoint import load, save
from models.theorem1 import theorem1_model

DEFAULT_CHECKPOINT = Path(__file__).parent / "checkpoints" / "default"

__all__ = ["DEFAULT_CHECKPOINT", "CausalTransformer", "CausalTransformerConfig", "load", "save", "theorem1_model"]
