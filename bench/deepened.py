"""A GPT-2 of a larger shape that computes what a small trained GPT-2 computes: its layers placed among
identity layers, its residual stream, heads and MLP neurons embedded in wider ones. A model of the shape a
researcher brings (``GPT2Config(n_layer=12, n_head=12, n_embd=768)``, the 50,257-token vocabulary) whose
progress on the task is the shipped model's, so that the circuit's path for big graphs runs on a model with
something to find; a random model of that shape has no progress and gets no circuit.

    python -m bench.deepened runs/gpt2_small_shape                 # 12 layers, 12 heads, width 768
    python -m bench.deepened runs/stand_in --n-layer 4 --n-head 8 --n-embd 64 --vocab-size 1000

How, exactly (to float rounding). The small model's writes into the residual are centred first (each minus
its mean over the residual's dimensions: LayerNorm subtracts that mean, so nothing changes), so its residual
``x`` (width n) has mean zero. The wide residual is ``[s x, 0, ..., 0]`` with ``s = sqrt(N / n)`` (width N):
its mean is still zero and its variance over N dimensions is that of ``x`` over n, so a LayerNorm whose
weights are the small one's divided by ``s`` on the first n dimensions (0 elsewhere) gives ``[LN(x), 0]``.
Every write is the small one's times ``s``. Head h of a placed layer is the small head h in the first d of
its D dimensions (its queries times ``sqrt(D / d)``, so that the scores' ``1 / sqrt(D)`` is the small
model's ``1 / sqrt(d)``); the other heads, the other MLP neurons and the identity layers read with random
weights (GPT-2's initialisation) and write nothing (their output weights 0). The unembedding's rows of the
task's tokens are the small model's; the other rows of the embedding and unembedding are random.

With ``--noise s`` the model is a planted one (issue 51): every other head and MLP neuron (the distractors: the
other layers', and the placed layers' heads and neurons beyond the small model's) writes too, its output
weights GPT-2's initialisation times ``s``, so that the model computes what the small one does plus noise,
and the small model's heads are a circuit known in advance among distractors that read and write.
``planted_nodes`` names them.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel

from models import STANDARD_CHECKPOINT


def _centred(w: torch.Tensor) -> torch.Tensor:
    """A write with its mean over the residual's dimensions (the last axis) removed."""
    return w - w.mean(-1, keepdim=True)


def deepen(source: Path, out: Path, n_layer: int = 12, n_head: int = 12, n_embd: int = 768,
           vocab_size: int = 50257, at: tuple[int, ...] | None = None, seed: int = 0,
           noise: float = 0.0) -> Path:  # fmt: skip
    """Write to ``out`` (a Hugging Face folder with ``source``'s task.json) the GPT-2 of the given shape that
    computes what the GPT-2 folder ``source`` computes, its layers at ``at`` (default: spread evenly), every
    distractor's output weights GPT-2's initialisation times ``noise`` (0: they write nothing); see the
    module docstring. Returns ``out``."""
    src_cfg = json.loads((Path(source) / "config.json").read_text())
    src = load_file(str(Path(source) / "model.safetensors"))
    n, H, L = src_cfg["n_embd"], src_cfg["n_head"], src_cfg["n_layer"]
    inner = src_cfg.get("n_inner") or 4 * n
    at = tuple(round(i * (n_layer - 1) / max(L - 1, 1)) for i in range(L)) if at is None else tuple(at)
    if len(at) != L or len(set(at)) != L or not all(0 <= i < n_layer for i in at) or sorted(at) != list(at):
        raise ValueError(f"at: expected {L} increasing layers among 0..{n_layer - 1}, got {at}")
    if n_embd < n or n_head < H or n_embd // n_head < n // H or vocab_size < src_cfg["vocab_size"]:
        raise ValueError(f"the new shape (n_embd {n_embd}, n_head {n_head}, vocab {vocab_size}) must hold the "
                         f"source's (n_embd {n}, n_head {H}, vocab {src_cfg['vocab_size']})")  # fmt: skip
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab_size,
                     n_positions=max(1024, src_cfg["n_positions"]), activation_function=src_cfg["activation_function"],
                     layer_norm_epsilon=src_cfg["layer_norm_epsilon"], tie_word_embeddings=False,
                     bos_token_id=src_cfg.get("bos_token_id"), eos_token_id=src_cfg.get("eos_token_id"))  # fmt: skip
    model = GPT2LMHeadModel(cfg)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    if not noise >= 0:
        raise ValueError(f"noise: expected a scale >= 0 of GPT-2's initialisation, got {noise}")
    s, d, D, N = (n_embd / n) ** 0.5, n // H, n_embd // n_head, n_embd
    V = src_cfg["vocab_size"]

    def norm(prefix: str, src_prefix: str) -> None:
        sd[prefix + ".weight"].zero_()
        sd[prefix + ".bias"].zero_()
        sd[prefix + ".weight"][:n] = src[src_prefix + ".weight"] / s
        sd[prefix + ".bias"][:n] = src[src_prefix + ".bias"]

    for name, src_name in (("transformer.wte.weight", "transformer.wte.weight"),
                           ("transformer.wpe.weight", "transformer.wpe.weight")):  # fmt: skip
        rows = src[src_name].shape[0]
        sd[name][:rows] = 0
        sd[name][:rows, :n] = s * _centred(src[src_name])
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        sd[p + "attn.c_proj.weight"].mul_(noise)  # the distractors' writes; the small model's are set below
        sd[p + "attn.c_proj.bias"].zero_()
        sd[p + "mlp.c_proj.weight"].mul_(noise)
        sd[p + "mlp.c_proj.bias"].zero_()
        if i not in at:
            continue
        q = f"transformer.h.{at.index(i)}."
        norm(p + "ln_1", q + "ln_1")
        norm(p + "ln_2", q + "ln_2")
        w, b = src[q + "attn.c_attn.weight"], src[q + "attn.c_attn.bias"]  # [n, 3n], [3n]: q | k | v
        for h in range(H):
            for part, scale in ((0, (D / d) ** 0.5), (1, 1.0), (2, 1.0)):
                cols, new = (
                    slice(part * n + h * d, part * n + (h + 1) * d),
                    slice(part * N + h * D, part * N + h * D + d),
                )
                sd[p + "attn.c_attn.weight"][:, part * N + h * D : part * N + (h + 1) * D] = 0  # the whole head
                sd[p + "attn.c_attn.bias"][part * N + h * D : part * N + (h + 1) * D] = 0
                sd[p + "attn.c_attn.weight"][:n, new] = scale * w[:, cols]
                sd[p + "attn.c_attn.bias"][new] = scale * b[cols]
            sd[p + "attn.c_proj.weight"][h * D : (h + 1) * D] = 0  # the head's other D - d dimensions hold zero
            sd[p + "attn.c_proj.weight"][h * D : h * D + d, :n] = s * _centred(
                src[q + "attn.c_proj.weight"][h * d : (h + 1) * d]
            )
        sd[p + "attn.c_proj.bias"][:n] = s * _centred(src[q + "attn.c_proj.bias"])
        sd[p + "mlp.c_fc.weight"][:, :inner] = 0
        sd[p + "mlp.c_fc.weight"][:n, :inner] = src[q + "mlp.c_fc.weight"]
        sd[p + "mlp.c_fc.bias"][:inner] = src[q + "mlp.c_fc.bias"]
        sd[p + "mlp.c_proj.weight"][:inner] = 0
        sd[p + "mlp.c_proj.weight"][:inner, :n] = s * _centred(src[q + "mlp.c_proj.weight"])
        sd[p + "mlp.c_proj.bias"][:n] = s * _centred(src[q + "mlp.c_proj.bias"])
    norm("transformer.ln_f", "transformer.ln_f")
    sd["lm_head.weight"][:V] = 0
    sd["lm_head.weight"][:V, :n] = src["lm_head.weight"]
    model.load_state_dict(sd)
    out = Path(out)
    model.save_pretrained(out)
    shutil.copy(Path(source) / "task.json", out / "task.json")
    return out


def planted_nodes(source: Path, n_layer: int, at: tuple[int, ...] | None = None) -> list[str]:
    """The heads and MLPs of ``source`` (a GPT-2 folder) as ``deepen`` places them in ``n_layer`` layers
    (``L{layer}H{head}``, ``MLP{layer}``): the circuit a planted model hides among its distractors."""
    src_cfg = json.loads((Path(source) / "config.json").read_text())
    L, H = src_cfg["n_layer"], src_cfg["n_head"]
    at = tuple(round(i * (n_layer - 1) / max(L - 1, 1)) for i in range(L)) if at is None else tuple(at)
    return [f"L{layer}H{h}" for layer in at for h in range(H)] + [f"MLP{layer}" for layer in at]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.deepened", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="folder to write (a Hugging Face GPT-2 folder with task.json)")
    p.add_argument(
        "--source", default=str(STANDARD_CHECKPOINT), help="the small GPT-2 folder (default: the shipped one)"
    )
    for flag, default in (("n-layer", 12), ("n-head", 12), ("n-embd", 768), ("vocab-size", 50257), ("seed", 0)):
        p.add_argument(f"--{flag}", type=int, default=default, help=f"(default: {default})")
    p.add_argument("--at", type=int, nargs="+", help="the layers the small model's go to (default: spread evenly)")
    p.add_argument("--noise", type=float, default=0.0,
                   help="the distractors' output weights: GPT-2's initialisation times this (default: 0, no writes)")
    a = p.parse_args(argv)
    deepen(Path(a.source), Path(a.out), a.n_layer, a.n_head, a.n_embd, a.vocab_size,
           at=None if a.at is None else tuple(a.at), seed=a.seed, noise=a.noise)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
