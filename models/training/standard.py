"""A standard transformer on the same task: a pre-norm GPT-2 (attention, MLP, LayerNorm, learned absolute
positions) reading the flat example-major context with the ordinary next-token shift.

    python -m models.standard --out models/checkpoints/standard --overwrite   # regenerates the shipped checkpoint
    python -m models.standard --out runs/plateau --alpha 1 --gamma 0.2 --steps 1000   # stays on the plateau
    python -m models.standard --help                     # every StandardConfig field is a flag
    python -m models.standard --task-kind random_dag:parents=1:kernel=dirichlet --alpha 1 --d-vocab 3 \
        --n-examples 0 --seq-len 20 --out runs/dag       # a task of the family (probes.graph_task)

The defaults are a recipe that learns (README, "Standard transformers"): d=5, L=6, H=6, sharp kernel
rows 0.98 Dirichlet(0.1) + 0.02/d drawn with task_seed 37 (demonstrations worth 0.58 nats: the
plateau's gap to BMA), the 2-layer GPT-2 of docs/paper.md section 6 (8 heads, width 64, MLP 256), AdamW 1e-3
cosine-decayed to 1e-4 over 8000 steps, batch 128, loss on every next token. On the kernel of docs/paper.md
section 6, rows 0.95 Dirichlet(0.3) + 0.05/d (``--alpha 0.3 --gamma 0.05``: 0.32 nats), the same
recipe leaves the plateau only after about 2000 steps and crawls (progress 0.70 after 6500 steps). On
the flat kernel 0.8 Dirichlet(1) + 0.2/d (``--alpha 1 --gamma 0.2``: 0.02 nats) it stays on the
plateau: the negative control. ``--arch attn_only`` drops the MLPs and LayerNorms (a LayerNorm-free
attention-only transformer, for ``analyses.phase_diagram``; it has no Hugging Face folder, so it is
never saved).

The logits at flat position p predict token p + 1, so the prediction of the target token x_h sits at
flat position ``L*H + h - 1``; the root x_0 of the target is predicted from the last token of the last
demonstration (with no demonstration, L = 0, nothing precedes it: row 0 is read at position -1, the last
token, and stays out of every NLL, which starts at h = 1). Saved as a Hugging Face causal-LM folder (``config.json``, ``model.safetensors``) with a
``task.json`` beside it (schema: ``models.loading.sources.task_json``) and ``training.json`` (config and eval history);
``models.load(folder)`` returns it as a ``transformer_lens.TransformerBridge``. Training is a function
of the config and the torch thread count (``--threads``, default 1): the same seed gives the same weights.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from models import cli
from models.loading.checkpoint import (
    HUGGING_FACE,
    check_replaceable,
    recover_run,
    resolved_out,
    snapshot_folder,
    training_lock,
    write_folder_atomically,
)
from models.loading.sources.files import TASK_JSON
from models.loading.sources.hugging_face import check_size
from models.plumbing.io import UsageError, check_memory, exclusive_lock, input_errors, size
from models.plumbing.progress import progress as progress_bar
from models.training.optim import check_finite, cosine_factor, keep_freed_memory, sample_batch
from probes import MarkovTreeTask, check_tokens, target_nll
from probes.graph_task import SPEC_HELP, GraphTask, make_task
from probes.metrics import last_token_nll
from probes.oracles import bayes, check_bayes, uniform_parent_predictive
from probes.tasks import check_float

TRAINING_JSON = "training.json"
ARCHS = ("gpt2", "attn_only")
LOSSES = ("all", "target", "last")

CHOICES = {"arch": ARCHS, "loss_on": LOSSES}  # flags with a fixed set of values


@dataclass
class StandardConfig:
    # task (the same sampler as models.train): d=5, L=6, H=6, rows 0.98 Dirichlet(0.1) + 0.02/d. The same fields
    # as TrainConfig's first seven, with other defaults (a shared base would reorder --help): a pair `duplicates` lists
    d_vocab: int = cli.flag(5)
    n_examples: int = cli.flag(6)
    seq_len: int = cli.flag(6)
    alpha: float = cli.flag(0.1)
    gamma: float = cli.flag(0.02, "floor of the kernel: every pi entry is at least gamma / d")
    task_seed: int = cli.flag(
        37, "seed that draws pi (the default's demonstrations are worth 0.58 nats over the plateau)"
    )
    task_kind: str = cli.flag(
        "markov_tree", f"the task: markov_tree (the paper's), or one of the family (probes.graph_task): {SPEC_HELP}"
    )
    # model: GPT-2 blocks are pre-norm (ln_1 -> attn, ln_2 -> MLP, final ln_f)
    arch: str = cli.flag("gpt2", "gpt2 (pre-norm GPT-2 blocks), or attn_only (no MLP, no LayerNorm; cannot be saved)")
    n_layers: int = cli.flag(2, "number of transformer blocks")
    n_heads: int = cli.flag(8, "attention heads per block")
    d_model: int = cli.flag(64, "width of the residual stream (a multiple of --n-heads)")
    d_mlp: int = cli.flag(256, "hidden width of each MLP")
    init_std: float = cli.flag(0.02, "standard deviation of the initial weights (GPT-2's initializer_range)")
    # optimisation
    seed: int = cli.flag(0, "seed of the initialisation and the training data")
    steps: int = cli.flag(8000)
    batch_size: int = cli.flag(128)
    lr: float = cli.flag(1e-3, "AdamW learning rate: linear warm-up, then cosine decay to lr * final-lr-fraction")
    warmup: int = cli.flag(0, "steps of linear learning-rate warm-up")
    final_lr_fraction: float = cli.flag(0.1, "learning rate at the last step, as a fraction of --lr (1: constant)")
    weight_decay: float = cli.flag(0.0, "AdamW weight decay")
    loss_on: str = cli.flag(
        "all",
        "all: every next token, as a language model; target: only the target sequence's tokens; "
        "last: only the context's last token (Nichani et al.'s loss)",
    )
    device: str = cli.flag("cpu")
    eval_every: int = cli.flag(500, "evaluate on held-out contexts every this many steps")
    eval_contexts: int = cli.flag(512)
    snapshot_every: int = cli.flag(
        0, "if > 0, also keep the model every this many steps under OUT/snapshots/step_XXXXXX/"
    )
    out: str = cli.flag("runs/standard", "folder to write the trained model to (a Hugging Face folder with task.json)")

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every", "eval_contexts", "n_layers", "n_heads", "d_model", "d_mlp"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UsageError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not isinstance(self.snapshot_every, int) or self.snapshot_every < 0:
            raise UsageError(f"snapshot_every must be an integer >= 0, got {self.snapshot_every!r}")
        if self.d_model % self.n_heads:
            raise UsageError(f"d_model={self.d_model} must be a multiple of n_heads={self.n_heads}")
        check_float(self.lr, "lr", 0, 10, open_low=True)  # above 10 Adam only diverges
        check_float(self.init_std, "init_std", 0, 10, open_low=True)
        check_float(self.weight_decay, "weight_decay", 0, 10)
        check_float(self.final_lr_fraction, "final_lr_fraction", 0, 1, open_low=True)
        if self.warmup < 0:
            raise UsageError(f"warmup must be >= 0, got {self.warmup}")
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise UsageError(f"{name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise UsageError(f"device {self.device!r} requested but CUDA is not available; use --device cpu")
        check_float(self.alpha, "alpha", 0, cli.MAX_ALPHA, open_low=True)
        if self.task_kind == "continuous" or not isinstance(self.task_kind, str):
            raise UsageError(
                f"task_kind {self.task_kind!r}: a standard transformer reads tokens; expected a discrete task"
            )
        if self.task_kind in ("markov_tree", "continuous") and self.n_examples == 0:
            raise UsageError(f"n_examples must be >= 1 for the task {self.task_kind} (only the family's tasks take 0)")
        if self.task_kind not in ("markov_tree", "continuous"):  # ours need no drawing to be checked
            check_bayes(self.task())  # an unknown kind, a graph that is not a DAG, no exact oracle: one ValueError

    def task(self) -> MarkovTreeTask | GraphTask:
        """The task these fields draw (one that cannot be drawn: the ``UsageError`` of its fields)."""
        with input_errors():
            return make_task(
                self.task_kind, self.d_vocab, self.n_examples, self.seq_len, self.alpha, self.gamma, self.task_seed
            )


class _Zero(nn.Module):
    """Adds nothing to the residual stream: the MLP of an attention-only block."""

    def forward(self, x: Float[Tensor, "batch T d_model"]) -> Float[Tensor, "batch T d_model"]:
        return torch.zeros_like(x)


def gpt2_config(cfg: StandardConfig, n_tokens: int):
    """The ``GPT2Config`` of these flags (no dropout), sized (``check_size``) before anything is built."""
    from transformers import GPT2Config  # heavy; only when a model is sized or built

    hf = GPT2Config(
        vocab_size=cfg.d_vocab,
        n_positions=n_tokens,
        n_embd=cfg.d_model,
        n_inner=cfg.d_mlp,
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
    check_size(hf.to_dict(), "the GPT-2 of these flags", cfg.device)
    return hf


def build_gpt2(cfg: StandardConfig, n_tokens: int):
    """An untrained ``GPT2LMHeadModel`` (no dropout) with ``cfg.d_vocab`` tokens and n_tokens positions.
    For ``cfg.arch == 'attn_only'`` its LayerNorms are the identity and its MLPs add zero."""
    from transformers import GPT2LMHeadModel

    hf = gpt2_config(cfg, n_tokens)
    model = GPT2LMHeadModel(hf)
    if cfg.arch == "attn_only":
        for block in model.transformer.h:
            block.ln_1, block.ln_2, block.mlp = nn.Identity(), nn.Identity(), _Zero()
        model.transformer.ln_f = nn.Identity()
        model.attention_only = True  # save_standard refuses it: a GPT-2 folder would reload LayerNorms and MLPs
    return model.to(cfg.device)


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
    device = next(model.parameters()).device
    logits = logits_of(model, tokens.to(device))[:, prediction_positions(task.n_examples, task.seq_len).to(device)]
    return logits[..., : task.d_vocab].float().log_softmax(-1).cpu()


def progress(nll: float, nll_plateau: float, nll_bma: float) -> float:
    """How far a model has come from the uniform-parent plateau (0) to BMA (1):
    ``(nll_plateau - nll) / (nll_plateau - nll_bma)``."""
    if not nll_plateau > nll_bma:
        raise ValueError(f"progress needs the plateau NLL above BMA's; got {nll_plateau} and {nll_bma}")
    return (nll_plateau - nll) / (nll_plateau - nll_bma)


def _loss(model, tokens: Int[Tensor, "batch T"], cfg: StandardConfig) -> Tensor:
    logits = logits_of(model, tokens)
    if cfg.loss_on == "all":
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    if cfg.loss_on == "last":  # the logits at T - 2 predict the last token
        return F.cross_entropy(logits[:, -2], tokens[:, -1])
    pos = prediction_positions(cfg.n_examples, cfg.seq_len)[1:].to(tokens.device)  # x_1..x_{H-1}, as models.train
    return F.cross_entropy(logits[:, pos].flatten(0, 1), tokens[:, pos + 1].flatten())


@torch.no_grad()
def evaluate(model, task: MarkovTreeTask, tokens: Int[Tensor, "batch T"], reference: dict | None = None) -> dict:
    """NLL (h >= 1) of the model, BMA and the uniform-parent plateau on the same contexts, and the
    progress between them; the last token's NLL beside BMA's (what ``--loss-on last`` trains).
    ``reference``: the BMA and plateau entries of an earlier call on these tokens."""
    was_training = model.training
    model.eval()
    log_probs = target_log_probs(model, tokens, task)
    model.train(was_training)
    nll, last = target_nll(log_probs, tokens), last_token_nll(log_probs, tokens)
    ref = reference or reference_nlls(task, tokens)
    return {
        "nll": nll,
        **ref,
        "nll_gap": nll - ref["nll_bma"],
        "last_nll": last,
        "last_gap": last - ref["last_nll_bma"],
        # undefined (NaN) where the demonstrations are worth nothing on these contexts (tiny samples)
        "progress": progress(nll, ref["nll_uniform"], ref["nll_bma"]) if ref["plateau_gap"] > 0 else math.nan,
    }


def reference_nlls(task: MarkovTreeTask, tokens: Int[Tensor, "batch T"]) -> dict:
    """NLL (h >= 1) of BMA and of the uniform-parent plateau, and the plateau's gap to BMA (a family task: its
    Bayes oracle, ``probes.oracles.bayes``, and the unigram plateau)."""
    oracle = bayes(task, tokens)[0]
    nll_bma = target_nll(oracle, tokens)
    nll_uniform = target_nll(uniform_parent_predictive(task, tokens), tokens)
    last = last_token_nll(oracle, tokens)
    return {"nll_bma": nll_bma, "nll_uniform": nll_uniform, "plateau_gap": nll_uniform - nll_bma, "last_nll_bma": last}


def train_standard(cfg: StandardConfig, progress: bool = True, save: bool = True, overwrite: bool = False):
    """Train on fresh contexts; returns (model, history) and writes ``cfg.out`` if ``save`` (refusing to
    replace a non-empty folder unless ``overwrite``), holding the training lock on it for the whole run
    (a second run into it is refused at once, as ``models.train``'s). Runs on torch's current thread count."""
    if not save:
        return _train_standard(cfg, progress, save, overwrite)
    out = resolved_out(cfg.out)  # a symlinked --out: its target is replaced, never the link
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {cfg.out!r}: cannot create {str(out.parent)!r} ({e.strerror or e})") from None
    with exclusive_lock(training_lock(out), wait=False, what=f"--out {cfg.out!r} (another training)"):
        recover_run(out)
        check_out(out, overwrite)  # under the lock: no other run can fill it before this one writes
        return _train_standard(cfg, progress, save, overwrite)


def _train_standard(cfg: StandardConfig, progress: bool, save: bool, overwrite: bool):
    if save and cfg.arch == "attn_only":
        raise UsageError("an attn_only model has no Hugging Face folder; train it with save=False")
    if cfg.snapshot_every and not save:
        raise UsageError("snapshot_every needs save=True: snapshots are kept under the run's folder")
    task = cfg.task()
    torch.manual_seed(cfg.seed)
    model = build_gpt2(cfg, task.n_tokens)
    eval_tokens, _ = task.sample(cfg.eval_contexts, torch.Generator().manual_seed(cfg.seed + 1_000_003))
    reference = reference_nlls(task, eval_tokens)
    data_gen = torch.Generator().manual_seed(cfg.seed + 1)
    # foreach: one update for all tensors, bit for bit the per-tensor loop torch picks on CPU (test_optim)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: cosine_factor(s, cfg.steps, cfg.final_lr_fraction, cfg.warmup)
    )
    history: list[dict] = [{"step": 0, "loss": None, "seconds": 0.0, **evaluate(model, task, eval_tokens, reference)}]
    model.train()
    t0 = time.perf_counter()
    for done in (bar := progress_bar(range(1, cfg.steps + 1), "train standard", enabled=progress)):
        loss = _loss(model, sample_batch(task, cfg.batch_size, data_gen).to(cfg.device), cfg)
        _descend(loss, opt, sched)
        if cfg.snapshot_every and done % cfg.snapshot_every == 0:  # as models.train: the run, then the snapshot
            training = {"config": asdict(cfg), "threads": torch.get_num_threads(), "step": done, "history": history}
            # out is ours from here (checked above); the first write drops an earlier run's snapshots
            save_standard(model, cfg.out, task, training, overwrite=True, carry=done > cfg.snapshot_every)
            save_standard(model, snapshot_folder(cfg.out, done), task, training)
        if done % cfg.eval_every == 0 or done == cfg.steps:
            check_finite(model, loss.item(), done)  # no NaN model is ever saved
            m = {
                "step": done,
                "loss": loss.item(),
                "seconds": time.perf_counter() - t0,
                **evaluate(model, task, eval_tokens, reference),
            }
            history.append(m)
            bar.set_postfix(gap=f"{m['nll_gap']:.4f}", progress=f"{m['progress']:.3f}")
    bar.close()
    model.eval()
    if save:
        training = {"config": asdict(cfg), "threads": torch.get_num_threads(), "history": history}
        saved = cfg.snapshot_every and cfg.steps >= cfg.snapshot_every  # this run has written out already
        save_standard(model, cfg.out, task, training, overwrite=overwrite or bool(saved), carry=bool(saved))
    return model, history


def _descend(loss: Tensor, opt: torch.optim.Optimizer, sched) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()


def check_out(out: str | Path, overwrite: bool) -> None:
    """Refuse an ``out`` that is a file, another format's checkpoint or a folder that is not one (even
    with ``overwrite``), or a non-empty folder when not ``overwrite``."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; expected a folder")
    try:
        check_replaceable(out, HUGGING_FACE)
    except ValueError as e:
        raise UsageError(f"--out {e}") from None
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UsageError(f"--out {out} is not empty; refusing to overwrite it (pass --overwrite to replace it)")


def save_standard(
    model, out: str | Path, task: MarkovTreeTask, training: dict, overwrite: bool = False, carry: bool = True
) -> None:
    """Write the Hugging Face folder, task.json and training.json atomically (float32 weights); ``carry``
    as ``models.loading.checkpoint.save``'s (False: an earlier run's snapshots/ go once this folder is in place)."""
    if getattr(model, "attention_only", False):
        raise UsageError("an attn_only model has no Hugging Face folder (GPT-2 always has LayerNorms and MLPs)")
    check_out(out, overwrite)

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        (folder / TASK_JSON).write_text(json.dumps(task.to_dict(), indent=1) + "\n")
        (folder / TRAINING_JSON).write_text(json.dumps(training, indent=1) + "\n")

    import transformers  # heavy; only when saving

    transformers.logging.disable_progress_bar()
    try:
        write_folder_atomically(out, write, HUGGING_FACE, carry=carry)
    finally:
        transformers.logging.enable_progress_bar()


def parse_args(argv: list[str] | None = None) -> tuple[StandardConfig, argparse.Namespace]:
    """The flags, every one checked before any work (``cli.check_run_flags``: seeds, sizes, threads,
    device, a writable ``--out``); then the config, the memory it needs, and what ``--out`` holds."""
    parser = cli.parser("python -m models.standard", __doc__)
    cli.add_dataclass_flags(parser, StandardConfig, CHOICES)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default: 1; the weights depend on the thread count, so keep it for a rerun)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it is a non-empty folder")
    args = parser.parse_args(argv)
    cli.check_run_flags(parser, args, argv)
    with cli.flag_errors(parser, StandardConfig):
        cfg = cli.dataclass_from_args(StandardConfig, args)
        if cfg.arch == "attn_only":
            raise UsageError("--arch attn_only cannot be saved as a Hugging Face folder; use analyses.phase_diagram")
        check_resources(cfg)
        check_out(cfg.out, args.overwrite)
    return cfg, args


def check_resources(cfg: StandardConfig) -> None:
    """One line if a training step would not fit in memory, estimated from the config before anything
    is built: float32 weights, gradients and AdamW's two moments, and per context the activations kept for
    the backward pass (each block's residual, attention and MLP widths, and its heads' score matrices)."""
    task = cfg.task()
    gpt2_config(cfg, task.n_tokens)  # the model itself first: a message naming its size, not the batch's
    t, d, v = task.n_tokens, cfg.d_model, cfg.d_vocab
    params = 2 * v * d + t * d + cfg.n_layers * (4 * d * d + 2 * d * cfg.d_mlp + 10 * d + cfg.d_mlp)
    per = 4 * t * (cfg.n_layers * (10 * d + 2 * cfg.d_mlp + 3 * cfg.n_heads * t) + 3 * v)
    check_memory(16 * params + per * cfg.batch_size, f"--batch-size {cfg.batch_size} ({size(per)} a context)")
    check_memory(4 * params + per * cfg.eval_contexts, f"--eval-contexts {cfg.eval_contexts} ({size(per)} a context)")


def _main(argv: list[str]) -> None:
    cfg, args = parse_args(argv)
    keep_freed_memory()  # this process only trains: the step's buffers are reused, not mapped afresh
    _, history = train_standard(cfg, overwrite=args.overwrite)
    last = history[-1]
    trained = f"; the last token, the loss trained: gap {last['last_gap']:+.4f}" if cfg.loss_on == "last" else ""
    print(
        f"wrote {cfg.out} ({last['seconds']:.1f} s): NLL {last['nll']:.4f}, BMA {last['nll_bma']:.4f}, "
        f"uniform-parent plateau {last['nll_uniform']:.4f} (gap to BMA {last['nll_gap']:+.4f}, "
        f"plateau's {last['plateau_gap']:+.4f}; progress {last['progress']:.3f}{trained})"
    )


def main(argv: list[str] | None = None) -> None:
    """The command line: bad input is one line on stderr and exit code 2, a bug its traceback and exit code 1
    (``run_cli``)."""
    cli.run_cli(_main, argv, "python -m models.standard")


if __name__ == "__main__":
    main()
