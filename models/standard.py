"""A standard transformer on the same task: a pre-norm GPT-2 (attention, MLP, LayerNorm, learned absolute
positions) reading the flat example-major context with the ordinary next-token shift.

    python -m models.standard --out runs/standard --steps 200          # train, save
    python -m models.standard --out runs/standard --steps 200 --compare figures/
        # also trains the disentangled model on the same task and plots both training curves

The logits at flat position p predict token p + 1, so the prediction of the target token x_h sits at
flat position ``L*H + h - 1``; the root x_0 of the target is predicted from the last token of the last
demonstration. Saved as a Hugging Face causal-LM folder (``config.json``, ``model.safetensors``) with a
``task.json`` beside it (schema: ``models.formats``) and ``training.json`` (config and eval history);
``models.load(folder)`` returns it as a ``transformer_lens.TransformerBridge``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from models.checkpoint import write_folder_atomically
from models.formats import TASK_JSON
from probes import MarkovTreeTask, bma_predictive, check_tokens, target_nll

TRAINING_JSON = "training.json"


FIGURES = {
    "standard_vs_disentangled.png": (
        "training curves (NLL gap to BMA) of a small pre-norm GPT-2 and of the disentangled model on the same "
        "task, with BMA and the uniform-parent plateau as horizontal lines"
    ),
}


@dataclass
class StandardConfig:
    # task (the same sampler as models.train; defaults: the d=5, L=6, H=8)
    d_vocab: int = 5
    n_examples: int = 6
    seq_len: int = 8
    alpha: float = 1.0
    gamma: float = 0.2
    task_seed: int = 0
    # model: GPT-2 blocks are pre-norm (ln_1 -> attn, ln_2 -> MLP, final ln_f)
    n_layers: int = 2
    n_heads: int = 8
    d_model: int = 64
    init_std: float = 0.02  # GPT-2's initializer_range
    # optimisation
    seed: int = 0
    steps: int = 200
    batch_size: int = 64
    lr: float = 3e-3  # AdamW, linear warm-up then cosine decay to 5%
    warmup: int = 50
    weight_decay: float = 0.0
    loss_on: str = "target"  # "target": the target tokens x_1..x_{H-1}; "all": every next token
    eval_every: int = 25
    eval_contexts: int = 512
    out: str = "runs/standard"

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every", "eval_contexts", "n_layers", "n_heads", "d_model"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be a multiple of n_heads={self.n_heads}")
        if self.lr <= 0 or self.init_std <= 0:
            raise ValueError(f"lr and init_std must be > 0, got {self.lr} and {self.init_std}")
        if self.loss_on not in ("target", "all"):
            raise ValueError(f"loss_on must be 'target' or 'all', got {self.loss_on!r}")

    def task(self) -> MarkovTreeTask:
        return MarkovTreeTask.random(
            self.d_vocab, self.n_examples, self.seq_len, self.alpha, self.gamma, self.task_seed
        )


def build_gpt2(cfg: StandardConfig, n_tokens: int):
    """An untrained ``GPT2LMHeadModel`` (no dropout) with ``cfg.d_vocab`` tokens and n_tokens positions."""
    from transformers import GPT2Config, GPT2LMHeadModel

    hf = GPT2Config(
        vocab_size=cfg.d_vocab,
        n_positions=n_tokens,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layers,
        n_head=cfg.n_heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        initializer_range=cfg.init_std,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=False,
    )
    return GPT2LMHeadModel(hf)


def logits_of(model, tokens: Int[Tensor, "batch T"]) -> Float[Tensor, "batch T vocab"]:
    """Logits of a Hugging Face LM or a TransformerBridge (which returns them directly)."""
    out = model(tokens)
    return out if isinstance(out, Tensor) else out.logits


def prediction_positions(n_examples: int, seq_len: int) -> Tensor:
    """Flat positions whose logits predict the target tokens x_0..x_{H-1}: ``L*H + h - 1``."""
    return torch.arange(seq_len) + n_examples * seq_len - 1


def target_log_probs(model, tokens: Int[Tensor, "batch T"], task: MarkovTreeTask) -> Float[Tensor, "batch H d"]:
    """Log-probabilities of the target tokens in the ``CausalTransformer`` convention (row 0 = root)."""
    tokens = check_tokens(tokens, task.d_vocab, task.n_examples, task.seq_len)
    logits = logits_of(model, tokens)[:, prediction_positions(task.n_examples, task.seq_len)]
    return logits[..., : task.d_vocab].float().log_softmax(-1)


def uniform_parent_predictive(task: MarkovTreeTask, tokens, log: bool = True) -> Float[Tensor, "batch H d"]:
    """The plateau: attention spread evenly over the candidate parents, mean over h' < h of pi(. | x_h').
    It is BMA conditioned on no demonstration at all."""
    return bma_predictive(task.pi, tokens, task.n_examples, task.seq_len, task.root, demonstrations=[], log=log)


def _loss(model, tokens: Tensor, cfg: StandardConfig) -> Tensor:
    logits = logits_of(model, tokens)
    if cfg.loss_on == "all":
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    pos = prediction_positions(cfg.n_examples, cfg.seq_len)[1:]  # x_1..x_{H-1}, as the disentangled model
    return F.cross_entropy(logits[:, pos].flatten(0, 1), tokens[:, pos + 1].flatten())


@torch.no_grad()
def evaluate(model, task: MarkovTreeTask, tokens: Tensor) -> dict:
    """NLL (h >= 1) of the model, BMA and the uniform-parent plateau on the same contexts."""
    was_training = model.training
    model.eval()
    nll = target_nll(target_log_probs(model, tokens, task), tokens)
    model.train(was_training)
    nll_bma = target_nll(bma_predictive(task.pi, tokens, task.n_examples, task.seq_len, task.root, log=True), tokens)
    nll_uniform = target_nll(uniform_parent_predictive(task, tokens), tokens)
    return {
        "nll": nll,
        "nll_bma": nll_bma,
        "nll_uniform": nll_uniform,
        "nll_gap": nll - nll_bma,
        "plateau_gap": nll_uniform - nll_bma,
    }


def train_standard(cfg: StandardConfig, progress: bool = True, save: bool = True):
    """Train a GPT-2 on fresh contexts; returns (model, history) and writes ``cfg.out`` if ``save``."""
    task = cfg.task()
    torch.manual_seed(cfg.seed)
    model = build_gpt2(cfg, task.n_tokens)
    eval_tokens, _ = task.sample(cfg.eval_contexts, torch.Generator().manual_seed(cfg.seed + 1_000_003))
    data_gen = torch.Generator().manual_seed(cfg.seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, cfg))
    history: list[dict] = []
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: one thread is about twice as fast on a shared CPU
    try:
        t0 = time.perf_counter()
        for done in (bar := tqdm(range(1, cfg.steps + 1), disable=not progress, desc="train standard")):
            loss = _loss(model, task.sample(cfg.batch_size, data_gen)[0], cfg)
            _descend(loss, opt, sched)
            if done % cfg.eval_every == 0 or done == cfg.steps:
                m = {
                    "step": done,
                    "loss": loss.item(),
                    "seconds": time.perf_counter() - t0,
                    **evaluate(model, task, eval_tokens),
                }
                history.append(m)
                bar.set_postfix(gap=f"{m['nll_gap']:.4f}", plateau=f"{m['plateau_gap']:.4f}")
        bar.close()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    if save:
        save_standard(model, cfg.out, task, {"config": asdict(cfg), "history": history})
    return model, history


def _descend(loss: Tensor, opt: torch.optim.Optimizer, sched) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()


def _lr_factor(step: int, cfg: StandardConfig) -> float:
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    progress = min((step - cfg.warmup) / max(cfg.steps - cfg.warmup, 1), 1.0)
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress))


def save_standard(model, out: str | Path, task: MarkovTreeTask, training: dict) -> None:
    """Write the Hugging Face folder, task.json and training.json atomically."""

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        (folder / TASK_JSON).write_text(json.dumps(task.to_dict(), indent=1) + "\n")
        (folder / TRAINING_JSON).write_text(json.dumps(training, indent=1) + "\n")

    import transformers

    transformers.logging.disable_progress_bar()
    try:
        write_folder_atomically(out, write)
    finally:
        transformers.logging.enable_progress_bar()


def compare_figure(cfg: StandardConfig, history: list[dict], out: str | Path, progress: bool = True) -> dict:
    """Train the disentangled model (``models.train``) for the same steps on the same task and plot both
    NLL gaps to BMA against step, with BMA (0) and the uniform-parent plateau as horizontal lines."""
    import tempfile
    from types import SimpleNamespace

    import matplotlib.pyplot as plt

    from analyses.common import save_figure, save_json, style
    from models.train import TrainConfig, train

    with tempfile.TemporaryDirectory() as tmp:
        tcfg = TrainConfig(
            d_vocab=cfg.d_vocab,
            n_examples=cfg.n_examples,
            seq_len=cfg.seq_len,
            alpha=cfg.alpha,
            gamma=cfg.gamma,
            task_seed=cfg.task_seed,
            seed=cfg.seed,
            steps=cfg.steps,
            batch_size=cfg.batch_size,
            eval_every=cfg.eval_every,
            eval_contexts=cfg.eval_contexts,
            out=str(Path(tmp) / "disentangled"),
        )
        _, disentangled = train(tcfg, progress=progress)
    plateau = history[-1]["plateau_gap"]
    style()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(
        [m["step"] for m in history],
        [m["nll_gap"] for m in history],
        "o-",
        ms=3,
        label=f"standard GPT-2 ({cfg.n_layers} layers, {cfg.n_heads} heads, width {cfg.d_model})",
    )
    ax.plot(
        [m["step"] for m in disentangled],
        [m["nll_gap"] for m in disentangled],
        "s-",
        ms=3,
        label="disentangled two-layer model",
    )
    ax.axhline(0, color="k", lw=1, label="BMA")
    ax.axhline(plateau, color="C3", ls="--", lw=1, label="uniform-parent plateau")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_ylim(bottom=0)
    ax.set(
        xlabel="training step",
        ylabel="NLL - NLL(BMA) (nats)",
        title=f"Training curves, d={cfg.d_vocab} L={cfg.n_examples} H={cfg.seq_len}, "
        f"{cfg.eval_contexts} held-out contexts",
    )
    ax.legend(fontsize=7)
    save_figure(fig, out, "standard_vs_disentangled")
    result = {
        "standard": history,
        "disentangled": [{k: m[k] for k in ("step", "nll", "nll_bma", "nll_gap")} for m in disentangled],
        "plateau_gap": plateau,
    }
    save_json(
        out, "standard_vs_disentangled", result, SimpleNamespace(seed=cfg.seed, n_contexts=cfg.eval_contexts), None
    )
    return result


def parse_args(argv: list[str] | None = None) -> tuple[StandardConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="python -m models.standard", description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(StandardConfig):
        kind = {"int": int, "float": float, "str": str}[f.type]
        parser.add_argument(
            "--" + f.name.replace("_", "-"), type=kind, default=f.default, help=f"(default: {f.default})"
        )
    parser.add_argument(
        "--compare",
        metavar="FIGURES_DIR",
        default=None,
        help="also train the disentangled model and write standard_vs_disentangled.png there",
    )
    args = parser.parse_args(argv)
    try:
        cfg = StandardConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(StandardConfig)})
    except ValueError as e:
        parser.error(str(e))
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out} is a file; expected a folder")
    if not out.parent.is_dir():
        parser.error(f"--out {out}: parent folder {out.parent} does not exist")
    if args.compare is not None and not Path(args.compare).is_dir():
        parser.error(f"--compare {args.compare} is not an existing folder")
    return cfg, args


def main(argv: list[str] | None = None) -> None:
    cfg, args = parse_args(argv)
    try:
        _, history = train_standard(cfg)
        last = history[-1]
        print(
            f"wrote {cfg.out} ({last['seconds']:.1f} s): NLL {last['nll']:.4f}, BMA {last['nll_bma']:.4f}, "
            f"uniform-parent plateau {last['nll_uniform']:.4f} (gap to BMA {last['nll_gap']:+.4f}, "
            f"plateau's {last['plateau_gap']:+.4f})"
        )
        if args.compare is not None:
            compare_figure(cfg, history, args.compare)
            print(f"wrote {Path(args.compare) / 'standard_vs_disentangled.png'}")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
