"""Train the two-layer model on fresh contexts of the Markov-tree task.

    python -m models.train --out runs/default          # the default config (regenerates the shipped checkpoint)
    python -m models.train --help                      # every TrainConfig field is a flag
    python -m models.train --preset medium --out runs/medium    # d=10, L=K=32, H=24 (README: scale)
    torchrun --standalone --nproc_per_node 2 -m models.train --out runs/ddp   # data-parallel (models.training.distributed)
    python -m models.train --task-kind ngram:n=3:kernel=dirichlet --alpha 0.1 --d-vocab 3 --n-examples 0 \
        --n-copy-heads 3 --seq-len 32 --out runs/ngram      # a task of the family (probes.graph_task)

Every ``eval_every`` steps it evaluates on held-out contexts (the NLL gap to BMA, the mean TV between
the blocks.1 attention and the BMA posterior, parent-identification accuracy next to BMA's; on a family
task the task's Bayes oracle, ``probes.oracles``, and for a fixed graph the graph as the posterior) and
writes the checkpoint with its training state, so ``--resume`` continues a killed run exactly.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import safetensors.torch
import torch
from tqdm.auto import tqdm

from models import cli
from models.interp.memory import forward_bytes
from models.loading import checkpoint
from models.loading.checkpoint import (
    CONFIG,
    TRAIN_META,
    TRAIN_STATE,
    load_checkpoint,
    model_class,
    read_config,
    save,
    training_lock,
)
from models.nets.build import build
from models.nets.causal_transformer import CausalTransformer, CausalTransformerConfig
from models.nets.continuous import mse_loss
from models.nets.dtypes import RUN_DTYPES
from models.plumbing.io import (
    UsageError,
    check_memory,
    describe,
    exclusive_lock,
    input_errors,
    read_json,
    run_cli,
    size,
)
from models.plumbing.progress import progress as progress_bar
from models.training import distributed
from models.training.evaluate import evaluate
from models.training.optim import check_finite, cosine_factor, keep_freed_memory, sample_batch
from probes import MarkovTreeTask
from probes.continuous import ContinuousTask
from probes.graph_task import SPEC_HELP, GraphTask, make_task, relative_offsets
from probes.oracles import check_bayes
from probes.tasks import MAX_N_EXAMPLES, MAX_SEED, check_float, check_int, check_sizes

CHOICES = {"dtype": RUN_DTYPES}  # flags with a fixed set of values


@dataclass
class TrainConfig:
    """What ``python -m models.train`` trains: each field a flag, with its ``--help`` sentence (``cli.flag``)."""

    # task
    d_vocab: int = cli.flag(5)
    n_examples: int = cli.flag(10)
    seq_len: int = cli.flag(12)
    alpha: float = cli.flag(1.0)
    gamma: float = cli.flag(0.2, "floor of the kernel: every pi entry is at least gamma / d (Lemma 3)")
    task_seed: int = cli.flag(0, "seed that draws pi (and A for the continuous task)")
    task_kind: str = cli.flag(
        "markov_tree",
        "the task: markov_tree (the paper's), continuous (x_h = rho A^T x_pa(h) + noise), or one of the "
        f"family (probes.graph_task): {SPEC_HELP}",
    )
    rho: float = cli.flag(0.5, "continuous task only: the parent-to-child correlation")
    # model
    n_copy_heads: int | None = cli.flag(None, "number K of layer-1 copyer heads (default: K = L)")
    dtype: str = cli.flag("float32", "floating-point type of the weights and the computation")
    device: str = cli.flag("cpu")
    init_offset: float = cli.flag(1.0, "the copyers' w_H starts at +init_offset at offset 0 and -init_offset elsewhere")
    init_demo: float = cli.flag(
        5.0, "the copyers' w_L starts at +init_demo on one demonstration per head (a random permutation)"
    )
    # optimisation
    seed: int = cli.flag(0, "seed of the initialisation, the training data and the evaluation contexts")
    steps: int = cli.flag(3000)
    batch_size: int = cli.flag(256)
    lr: float = cli.flag(1e-2, "Adam learning rate, cosine-decayed to lr * final-lr-fraction")
    copyer_lr_scale: float = cli.flag(1.0, "the copyers' w_H and w_L learn at lr * copyer-lr-scale")
    final_lr_fraction: float = cli.flag(0.05, "learning rate at the last step, as a fraction of --lr")
    # evaluation and output
    eval_every: int = cli.flag(
        250, "evaluate on held-out contexts and save a resumable checkpoint every this many steps"
    )
    eval_contexts: int = cli.flag(2048)
    snapshot_every: int = cli.flag(0, "if > 0, also keep a checkpoint every this many steps under OUT/snapshots/")
    out: str = cli.flag("runs/train", "checkpoint folder to write")
    resume: bool = cli.flag(False, "continue from the training state in --out (an error if it has none)")
    overwrite: bool = cli.flag(False, "replace a checkpoint already at --out, and its snapshots/ (otherwise refused)")
    compile: bool = cli.flag(False, "torch.compile the training forward: minutes to compile, then faster steps")
    autocast: bool = cli.flag(
        False,
        "training forward and backward in bfloat16 (torch.autocast); weights, Adam and evaluation stay in --dtype",
    )

    def __post_init__(self):
        """Every field checked (type, finiteness, bound) before anything is built: one ValueError that
        starts with the field's name."""
        check_sizes(self.d_vocab, self.n_examples, self.seq_len, where="", min_examples=0)  # 0: family tasks
        if self.n_copy_heads is not None:
            check_int(self.n_copy_heads, "n_copy_heads", 1, MAX_N_EXAMPLES)
        elif self.n_examples == 0:
            raise UsageError("n_copy_heads must be given when n_examples = 0 (its default is K = L)")
        for name in ("steps", "batch_size", "eval_every", "eval_contexts"):
            check_int(getattr(self, name), name, 1)
        check_int(self.snapshot_every, "snapshot_every", 0)
        for name in ("seed", "task_seed"):
            check_int(getattr(self, name), name, 0, MAX_SEED)
        check_float(self.alpha, "alpha", 0, cli.MAX_ALPHA, open_low=True)
        check_float(self.gamma, "gamma", 0, 1)
        check_float(self.rho, "rho", 0, 1, open_low=True, open_high=True)
        check_float(self.lr, "lr", 0, open_low=True)
        check_float(self.copyer_lr_scale, "copyer_lr_scale", 0)
        check_float(self.final_lr_fraction, "final_lr_fraction", 0, 1)
        check_float(self.init_offset, "init_offset", -1e4, 1e4)
        check_float(self.init_demo, "init_demo", -1e4, 1e4)
        if not isinstance(self.task_kind, str):
            raise UsageError(f"task_kind must be a string, got {self.task_kind!r}")
        if self.task_kind in ("markov_tree", "continuous") and self.n_examples == 0:
            raise UsageError(f"n_examples must be >= 1 for the task {self.task_kind} (only the family's tasks take 0)")
        if self.task_kind not in ("markov_tree", "continuous"):  # ours need no drawing to be checked
            task = self.task()
            check_bayes(task)  # an unknown kind, a graph that is not a DAG, no exact oracle: one ValueError
            if self.n_examples == 0 and relative_offsets(getattr(task, "parents", None)) is None:
                raise UsageError(
                    f"task_kind {self.task_kind!r} with --n-examples 0: the disentangled model reads relative "
                    "positions only (its copyers copy the same offsets at every position), and this task's parents "
                    "are not at the same offsets at every position (a chain's and an n-gram's are); train a standard "
                    "transformer on it (python -m models.standard), or give it demonstrations (--n-examples >= 1)"
                )
        if self.dtype not in RUN_DTYPES:
            raise UsageError(f"dtype must be one of {', '.join(RUN_DTYPES)}, got {self.dtype!r}")
        for name in ("resume", "overwrite", "compile", "autocast"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.out, str) or not self.out:
            raise UsageError(f"out must be a folder name, got {self.out!r}")
        checkpoint.check_device(self.device)

    def task(self) -> MarkovTreeTask | GraphTask | ContinuousTask:
        """The task these fields draw; one that cannot be drawn (an alpha whose draws underflow, ...) is the
        ``UsageError`` of its fields."""
        with input_errors():
            if self.task_kind == "continuous":  # d_vocab is the vector dimension; A is drawn from task_seed
                return ContinuousTask.random(self.d_vocab, self.n_examples, self.seq_len, self.rho, self.task_seed)
            return make_task(
                self.task_kind, self.d_vocab, self.n_examples, self.seq_len, self.alpha, self.gamma, self.task_seed
            )

    def model_config(self) -> CausalTransformerConfig:
        return CausalTransformerConfig(
            self.d_vocab, self.n_examples, self.seq_len, self.n_copy_heads, self.dtype, self.device
        )


# --preset NAME sets these fields (explicit flags still override them). The scale recipe (README,
# "Scale"): init_demo ~ log L + 3 keeps each head's mass on its demonstration ~0.95 at
# init (the default 5 gives 0.94 at L=10 but 0.82 at L=32, 0.70 at L=64); init_offset 2 starts the
# copies at offset 0; copyer_lr_scale 0.3 stops the copies softening (a full W_KQ barely penalises it).
# Measured in float32: medium (1500 steps) within gap < 0.01 and TV <= 0.05 by step 1000, 32/32 distinct
# heads (purity 0.95); large (float32, dense copies, 3000 steps) left the plateau near step 600 and ended at gap 0.0065, TV 0.022,
# 64/64 distinct (purity 0.84), first within the targets at step 2300. Both presets now train in bfloat16
# autocast (weights, Adam and evaluation in float32) with factored copies (causal_transformer.FACTOR_ABOVE)
# on a shorter cosine; README "Scale" has their histories, the fresh-context evaluations and the wall times.
PRESETS: dict[str, dict] = {
    "small": {},  # the defaults above: d=5, L=K=10, H=12
    "medium": {
        "d_vocab": 10,
        "n_examples": 32,
        "seq_len": 24,
        "init_demo": 6.5,
        "init_offset": 2.0,
        "copyer_lr_scale": 0.3,
        "steps": 1200,
        "autocast": True,
        "eval_every": 100,
        "eval_contexts": 1024,
    },
    "large": {
        "d_vocab": 20,
        "n_examples": 64,
        "seq_len": 32,
        "init_demo": 7.5,
        "init_offset": 2.0,
        "copyer_lr_scale": 0.3,
        "steps": 2200,
        "autocast": True,
        "eval_every": 200,
        "eval_contexts": 512,
    },
}


def step_loss(model, tokens: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The training loss: mean NLL of the H target tokens ``target [batch, H]`` over the batch (row 0
    through the root prior). ``model`` may be the ``CausalTransformer`` or a DDP/compiled wrapper."""
    if target.is_floating_point():  # the continuous task: target vectors, squared error of the means
        return mse_loss(model, tokens, target)
    return -model(tokens).gather(-1, target.unsqueeze(-1)).mean()


def _host_batch(tokens: torch.Tensor, seq_len: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens (validated on the host by the model) and targets on ``device``. For a GPU both are pinned
    so the copies are asynchronous: the training loop never waits for the device between steps."""
    target = tokens[:, -seq_len:].contiguous()
    if not device.startswith("cuda"):
        return tokens, target
    return tokens.pin_memory(), target.pin_memory().to(device, non_blocking=True)


@torch.no_grad()
def init_copyers(model: CausalTransformer, offset: float, demo: float, generator: torch.Generator) -> list[int]:
    """Break the head symmetry: prefer offset 0 in w_H and one demonstration per head in w_L.

    Heads get demonstrations through a random permutation, so nothing downstream may assume that
    head k copies demonstration k. Returns the preferred demonstration of each head (K <= L: distinct).
    With no demonstration (L = 0) head k prefers offset -(k+1) instead, and the demonstrations are [-1] * K.
    """
    attn = model.blocks[0].attn
    K, L, H = model.cfg.n_copy_heads, model.cfg.n_examples, model.cfg.seq_len
    attn.w_H.fill_(-offset)
    attn.w_H[:, H - 1] = offset
    attn.w_L.zero_()
    if L == 0:  # no demonstration: head k starts at offset -(k+1) in the target's own prefix (offset 0 is masked)
        attn.w_H[:, H - 1] = -offset
        attn.w_H[torch.arange(K), (H - 2 - torch.arange(K)).clamp_min(0)] = offset
        return [-1] * K
    perm = torch.randperm(max(K, L), generator=generator)[:K] % L
    attn.w_L[torch.arange(K), perm] = demo
    return perm.tolist()


def _optimizer_state(opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Adam's state as flat tensors (safetensors) plus JSON metadata."""
    sd = opt.state_dict()
    tensors = {f"optim.{i}.{k}": v for i, s in sd["state"].items() for k, v in s.items()}
    return tensors, {"param_groups": sd["param_groups"]}


def _load_optimizer_state(opt: torch.optim.Optimizer, tensors: dict, meta: dict) -> None:
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, i, name = key.split(".", 2)
            state.setdefault(int(i), {})[name] = value
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def train(cfg: TrainConfig, progress: bool = True) -> tuple[CausalTransformer, list[dict]]:
    """Train (or resume) and write the checkpoint to ``cfg.out``; returns the model and eval history.

    Under ``torchrun`` each process trains on its slice of the same global batch (``models.training.distributed``);
    rank 0 evaluates, writes the checkpoints and returns the history (the other ranks return [])."""
    place, device = distributed.setup(cfg.device)
    try:
        result = _train(cfg, progress and place.is_main, place, device)
        distributed.wait_for_all(place)  # not on an error: a rank stuck in a collective would hang
        return result
    finally:
        distributed.teardown(place)


def _train(cfg: TrainConfig, progress: bool, place: distributed.Rank, device: str):
    distributed.check_batch(cfg.batch_size, place)
    if not place.is_main:
        return _train_locked(cfg, progress, place, device, checkpoint.resolved_out(cfg.out))
    cli.check_out_folder(cfg.out)
    out = checkpoint.resolved_out(cfg.out)  # a symlinked --out: its target is the run's folder
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {cfg.out!r}: cannot create {str(out.parent)!r} ({e.strerror or e})") from None
    with exclusive_lock(training_lock(out), wait=False, what=f"--out {cfg.out!r} (another training)"):
        checkpoint.recover_run(out)  # a write killed part-way (its snapshots' too): old or new back, debris gone
        return _train_locked(cfg, progress, place, device, out)


def check_start(cfg: TrainConfig, out: Path) -> bool:
    """Whether to resume: never replace existing work unless asked. ``--resume`` needs a run with
    training state (``--resume --overwrite``: resume if there is one, else start afresh); a checkpoint
    already at ``--out`` is replaced only with ``--overwrite``; anything else there is refused."""
    try:  # never another format's checkpoint, not even with --overwrite
        checkpoint.check_replaceable(out)
    except ValueError as e:
        raise UsageError(f"--out {e}") from None
    has_state = (out / TRAIN_STATE).is_file() and (out / TRAIN_META).is_file()
    if cfg.resume and has_state:
        return True
    if cfg.resume and not cfg.overwrite:
        what = "does not exist" if not out.exists() else f"has no training state ({TRAIN_STATE}, {TRAIN_META})"
        raise UsageError(f"cannot --resume: --out {cfg.out!r} {what}; pass --overwrite to train it afresh")
    if (out / CONFIG).is_file() and not cfg.overwrite:
        raise UsageError(
            f"--out {cfg.out!r} holds a checkpoint; refusing to replace it: pass --overwrite to replace it"
            + (" or --resume to continue it" if has_state else "")
        )
    return False


def check_resources(cfg: TrainConfig, model, task) -> None:
    """The memory a training step (forward, backward, Adam) and the evaluation would take, measured on
    one and two contexts, against the memory available: one line naming the flag if it does not fit."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())

    def forward(tokens, fwd_hooks):
        with model.hooks(fwd_hooks=fwd_hooks):
            return model(tokens.to(model.cfg.device))

    one, two = forward_bytes(forward, task, 1), forward_bytes(forward, task, 2)
    per, shared = max(two - one, 1), max(2 * one - two, 0)
    step = 4 * params + 3 * (shared + per * cfg.batch_size)  # weights, grads, Adam's two moments; backward
    check_memory(step, f"--batch-size {cfg.batch_size} ({size(per)} a context)")
    check_memory(shared + 2 * per * cfg.eval_contexts, f"--eval-contexts {cfg.eval_contexts} ({size(per)} a context)")


def _train_locked(cfg: TrainConfig, progress: bool, place: distributed.Rank, device: str, out: Path):
    resume = check_start(cfg, out) if place.is_main else cfg.resume and (out / TRAIN_STATE).is_file()
    if resume:
        check_resumable(out, cfg)
    task = cfg.task()
    torch.manual_seed(cfg.seed)
    init_gen = torch.Generator().manual_seed(cfg.seed)
    model_cfg = dataclasses.replace(cfg.model_config(), device=device)
    model = build(model_class(cfg.task_kind), model_cfg, "the model of this config")
    if place.is_main:
        check_resources(cfg, model, task)
    init_copyers(model, cfg.init_offset, cfg.init_demo, init_gen)
    eval_tokens, eval_parents = task.sample(cfg.eval_contexts, torch.Generator().manual_seed(cfg.seed + 1_000_003))
    data_gen = torch.Generator().manual_seed(cfg.seed + 1)
    copyer = list(model.blocks[0].parameters())
    rest = [p for p in model.parameters() if all(p is not c for c in copyer)]
    opt = torch.optim.Adam([{"params": rest, "lr": cfg.lr}, {"params": copyer, "lr": cfg.lr * cfg.copyer_lr_scale}],
                           foreach=True)  # one call for all tensors, bit for bit the per-tensor loop (test_optim)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_factor(s, cfg.steps, cfg.final_lr_fraction))
    history: list[dict] = []
    start = 0
    if resume:
        start, history = _resume(out, cfg, model, opt, sched, data_gen)
        if place.is_main and cfg.snapshot_every and start % cfg.snapshot_every == 0:
            if not checkpoint.snapshot_folder(out, start).is_dir():  # killed between the checkpoint and its snapshot
                _save(model, task, cfg, history, None, None, None, start, checkpoint.snapshot_folder(out, start))
    carry = resume  # a run started afresh drops the old run's snapshots/ with its first checkpoint, not before
    if start == 0 and place.is_main:  # the state at initialisation, for the record (uses no randomness)
        history.append({"step": 0, "loss": None, "seconds": 0.0, **evaluate(model, task, eval_tokens, eval_parents)})
        if progress:
            tqdm.write(_describe(history[-1]))
    model.train()
    forward = distributed.wrap(model, place)
    if cfg.compile:
        forward = torch.compile(forward)
    t0 = time.perf_counter()
    bar = progress_bar(range(start, cfg.steps), "train", total=cfg.steps, enabled=progress, initial=start)
    for step in bar:
        tokens = sample_batch(task, cfg.batch_size, data_gen)  # the global batch, the same on every rank
        tokens, target = _host_batch(distributed.shard(tokens, place), cfg.seq_len, device)
        with torch.autocast(device.split(":")[0], torch.bfloat16, enabled=cfg.autocast):
            loss = step_loss(forward, tokens, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        done = step + 1
        evaluating = done % cfg.eval_every == 0 or done == cfg.steps
        snapshot = cfg.snapshot_every > 0 and done % cfg.snapshot_every == 0  # on its own steps, not eval's
        if not (evaluating or snapshot):
            continue
        loss = distributed.mean_over_ranks(loss, place).item()  # the only host-device syncs: eval, snapshots
        if not place.is_main:
            continue
        check_finite(model, loss, done)
        if evaluating:
            m = {
                "step": done,
                "loss": loss,
                "seconds": time.perf_counter() - t0,
                **evaluate(model, task, eval_tokens, eval_parents),
            }
            history.append(m)
            bar.set_postfix(gap=f"{m['nll_gap']:.4f}", tv=f"{m['tv_to_bma']:.3f}")
            if progress:
                tqdm.write(_describe(m))
        _save(model, task, cfg, history, opt, sched, data_gen, done, out, carry)  # resumable from here (snapshots inside)
        carry = True
        if snapshot:
            _save(model, task, cfg, history, None, None, None, done, checkpoint.snapshot_folder(out, done))
    bar.close()
    return model.eval(), history


def _describe(m: dict) -> str:
    """One line of evaluation metrics."""
    return (
        f"step {m['step']:6d}  nll {m['nll']:.4f} (BMA {m['nll_bma']:.4f}, gap {m['nll_gap']:+.4f})  "
        f"TV {m['tv_to_bma']:.4f}  parent acc {m['parent_acc']:.3f} (BMA {m['parent_acc_bma']:.3f})  "
        f"heads->{m['distinct_demos']}/{len(m['head_demo'])} demos, min purity {min(m['head_purity']):.3f}"
    )


def _save(model, task, cfg, history, opt, sched, data_gen, step, path, carry: bool = True) -> None:
    training = {"config": asdict(cfg), "step": step, "history": history}
    if opt is None:
        save(model, path, task=task, training=training)
        return
    tensors, meta = _optimizer_state(opt)
    tensors["data_generator"] = data_gen.get_state()
    tensors["torch_rng"] = torch.get_rng_state()
    meta.update(step=step, scheduler=sched.state_dict())
    save(model, path, task=task, training=training, train_state=tensors, train_meta=meta, carry=carry)


RESUME_MAY_DIFFER = ("resume", "overwrite", "compile", "out")  # the rest (--steps: the cosine spans it) must be the saved run's


AFRESH = "to train it afresh instead, run without --resume, with --overwrite"  # --resume --overwrite resumes a state


def check_resumable(out: Path, cfg: TrainConfig) -> dict:
    """The saved training record of ``out``, checked before any work: its config equals ``cfg`` (but
    for ``RESUME_MAY_DIFFER``) and its state files are readable. One line otherwise."""
    training = read_config(out).get("training")
    saved = training.get("config") if isinstance(training, dict) else None
    if not isinstance(saved, dict) or not isinstance(training.get("history"), list):
        raise UsageError(
            f"cannot resume {str(out)!r}: its {CONFIG} has no training record; {AFRESH}"
        )
    default = asdict(TrainConfig())  # a field newer than the saved run: it ran with the default
    differ = {k for k, v in asdict(cfg).items() if k not in RESUME_MAY_DIFFER and saved.get(k, default[k]) != v}
    if "steps" in differ:
        raise UsageError(
            f"cannot resume {str(out)!r} with --steps {cfg.steps}: it was started with --steps {saved['steps']} "
            f"(the cosine learning-rate schedule spans the whole run); resume with --steps {saved['steps']}, "
            "or train afresh (--overwrite, without --resume)"
        )
    if differ:
        raise UsageError(f"cannot resume {str(out)!r}: its training config differs in {sorted(differ)}")
    meta = read_json(out / TRAIN_META, "training state")
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int) or "scheduler" not in meta:
        raise UsageError(
            f"cannot resume {str(out)!r}: {TRAIN_META} is not a training state; {AFRESH}"
        )
    return training


def _resume(out: Path, cfg: TrainConfig, model, opt, sched, data_gen) -> tuple[int, list[dict]]:
    training = check_resumable(out, cfg)
    model.load_state_dict(load_checkpoint(out, device=cfg.device).state_dict())
    try:
        tensors = safetensors.torch.load_file(out / TRAIN_STATE)
        meta = json.loads((out / TRAIN_META).read_text())
        _load_optimizer_state(opt, tensors, meta)
        sched.load_state_dict(meta["scheduler"])
        data_gen.set_state(tensors["data_generator"])
        torch.set_rng_state(tensors["torch_rng"])
        step = check_int(meta["step"], "step", 1)
    except Exception as e:  # safetensors, Adam and the generators raise their own types on a corrupt state
        raise UsageError(
            f"cannot resume {str(out)!r}: its training state is unreadable ({describe(e)}); {AFRESH}"
        ) from None
    return step, training["history"]


def as_flags(message: str) -> str:
    """A ``TrainConfig`` error for the command line (``cli.as_flags``)."""
    return cli.as_flags(message, TrainConfig)


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = cli.parser("python -m models.train", __doc__)
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="small",
        help="model size and recipe; other flags override its fields (default: small)",
    )
    cli.add_dataclass_flags(parser, TrainConfig, CHOICES)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default: 1; float reductions depend on it)"
    )
    preset, _ = parser.parse_known_args(argv)
    parser.set_defaults(**PRESETS[preset.preset])
    args = parser.parse_args(argv)
    with cli.flag_errors(parser, TrainConfig):
        check_int(args.threads, "--threads", 1, 1024)
        torch.set_num_threads(args.threads)
        return cli.dataclass_from_args(TrainConfig, args)


def _main(argv: list[str]) -> None:
    cfg = parse_args(argv)
    keep_freed_memory()  # this process only trains: the step's buffers are reused, not mapped afresh
    try:
        _, history = train(cfg)
    except UsageError as e:  # a field named in a message from deeper down is named as its flag
        raise UsageError(as_flags(str(e))) from None
    if history:  # rank 0 (or the only process)
        print(f"wrote {cfg.out} ({history[-1]['seconds']:.1f} s)")


def main(argv: list[str] | None = None) -> None:
    """The command line: bad input is one line on stderr and exit code 2, a bug its traceback and exit code 1
    (``run_cli``)."""
    run_cli(_main, argv, "python -m models.train")


if __name__ == "__main__":
    main()
