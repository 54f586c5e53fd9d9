"""Write TransformerLens checkpoints with the real library, as the README says: ``torch.save(model.state_dict())``
and ``json.dump(model.cfg.to_dict(), default=str)``, plus each model's own log-probabilities on fixed ids.

Run under a TransformerLens 2.x/3.x release (its unpacked wheel first on PYTHONPATH, shadowing 4.x; it also
needs ``better_abc``), e.g.::

    pip download --no-deps transformer-lens==2.18.0 better-abc; unzip both into /tmp/tl218
    PYTHONPATH=/tmp/tl218 python tests/models/loading/data/write_transformer_lens.py OUT_DIR

``tests/models/loading/test_formats_real_transformer_lens.py`` runs it when ``TL_RELEASE_DIRS`` names such folders.
"""

import json
import sys
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore")  # 3.x: HookedTransformer is deprecated
import transformer_lens  # noqa: E402
from transformer_lens import HookedTransformer, HookedTransformerConfig  # noqa: E402

BASE = dict(n_layers=2, d_model=8, n_ctx=30, d_head=4, d_vocab=12, device="cpu")
CASES = {
    "gelu LN f32": dict(act_fn="gelu"),
    "gelu LN f64": dict(act_fn="gelu", dtype=torch.float64),
    "gelu_new LN folded": dict(act_fn="gelu_new", fold=True),
    "gelu_new LN folded f64": dict(act_fn="gelu_new", fold=True, dtype=torch.float64),
    "relu none": dict(act_fn="relu", normalization_type=None),
    "attn-only": dict(attn_only=True, n_layers=3),
    "no attn scale": dict(act_fn="gelu", use_attn_scale=False),
    "inverse layer idx": dict(act_fn="gelu", scale_attn_by_inverse_layer_idx=True, n_layers=3),
    "LNPre": dict(act_fn="gelu", normalization_type="LNPre"),
}
TASK = {
    "kind": "markov_tree", "d_vocab": 4, "n_examples": 3, "seq_len": 5, "pi": [[0.25] * 4] * 4,
    "layout": {"order": "example-major", "bos": 0, "sep": 1, "token_offset": 2},
}  # fmt: skip


def main(out: Path) -> None:
    ids = torch.randint(0, BASE["d_vocab"], (4, BASE["n_ctx"]), generator=torch.Generator().manual_seed(0))
    for name, kw in CASES.items():
        kw = dict(kw)
        fold = kw.pop("fold", False)
        torch.manual_seed(1)
        model = HookedTransformer(HookedTransformerConfig(**{**BASE, **kw}))
        with torch.no_grad():  # every parameter perturbed away from its initialisation
            for p in model.parameters():
                p.add_(0.3 * torch.randn_like(p))
        if fold:
            model.process_weights_(fold_ln=True, center_writing_weights=False, center_unembed=False)
        model.eval()
        with torch.no_grad():
            logp = model(ids).log_softmax(-1).double()
        folder = out / name.replace(" ", "_")
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), folder / "model.pt")
        with open(folder / "model.json", "w") as f:
            json.dump(model.cfg.to_dict(), f, default=str)
        torch.save({"ids": ids, "logp": logp, "version": transformer_lens.__file__}, folder / "reference.pt")
        (folder / "task.json").write_text(json.dumps(TASK))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
