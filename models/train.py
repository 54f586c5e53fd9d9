"""Train the two-layer model on fresh contexts of the Markov-tree task.

    python -m models.train --out runs/default          # the default config (regenerates the shipped checkpoint)
    python -m models.train --help                      # every TrainConfig field is a flag
    python -m models.train --preset medium --out runs/medium    # d=10, L=K=32, H=24 (README: scale)
    torchrun --standalone --nproc_per_node 2 -m models.train --out runs/ddp   # data-parallel (models.distributed)

Every ``eval_every`` steps it evaluates on held-out contexts (the NLL gap to BMA, the mean TV between
the blocks.1 attention and the BMA posterior, parent-identification accuracy next to BMA's) and
writes the checkpoint with its training state, so ``--resume`` continues a killed run exactly.
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

import safetensors.torch
import torch
from tqdm.auto import tqdm

from models import distributed
from models.causal_transformer import CausalTransformer, CausalTransformerConfig
from models.checkpoint import TRAIN_META, TRAIN_STATE, load_checkpoint, model_class, read_config, save
from models.continuous import mse_loss
from models.evaluate import evaluate
from probes import MarkovTreeTask
from probes.continuous import ContinuousTask


@dataclass
class TrainConfig:
    # task
    d_vocab: int = 5
    n_examples: int = 10  # L
    seq_len: int = 12  # H
    alpha: float = 1.0  # Dirichlet concentration of the rows of pi
    gamma: float = 0.2  # floor: pi >= gamma / d (Lemma 3)
    task_seed: int = 0  # draws pi
    task_kind: str = "markov_tree"  # or "continuous": x_h = rho A^T x_pa(h) + noise (models.continuous)
    rho: float = 0.5  # continuous task only: parent-to-child correlation
    # model
    n_copy_heads: int | None = None  # K; None means K = L
    dtype: str = "float32"
    device: str = "cpu"
    init_offset: float = 1.0  # w_H starts at +init_offset at offset 0, -init_offset elsewhere
    init_demo: float = 5.0  # w_L starts with +init_demo on one demonstration per head (a random permutation)
    # optimisation
    seed: int = 0  # initialisation, data and evaluation contexts
    steps: int = 3000
    batch_size: int = 256
    lr: float = 1e-2  # Adam; cosine-decayed to lr * final_lr_fraction
    copyer_lr_scale: float = 1.0  # the copyers' w_H, w_L learn at lr * copyer_lr_scale
    final_lr_fraction: float = 0.05
    # evaluation and output
    eval_every: int = 250
    eval_contexts: int = 2048
    snapshot_every: int = 0  # > 0: also keep a checkpoint every this many steps under out/snapshots/
    out: str = "runs/train"
    resume: bool = False  # continue from the training state in `out`
    compile: bool = False  # torch.compile the training forward: minutes to compile, then ~3x faster steps (README)

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every", "eval_contexts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.task_kind not in ("markov_tree", "continuous"):
            raise ValueError(f"task_kind must be 'markov_tree' or 'continuous', got {self.task_kind!r}")
        if self.task_kind == "continuous" and not 0 < self.rho < 1:
            raise ValueError(f"rho must lie in (0, 1), got {self.rho}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} requested but CUDA is not available; use --device cpu")

    def task(self) -> MarkovTreeTask:
        if self.task_kind == "continuous":  # d_vocab is the vector dimension; A is drawn from task_seed
            return ContinuousTask.random(self.d_vocab, self.n_examples, self.seq_len, self.rho, self.task_seed)
        return MarkovTreeTask.random(
            self.d_vocab, self.n_examples, self.seq_len, self.alpha, self.gamma, self.task_seed
        )

    def model_config(self) -> CausalTransformerConfig:
        return CausalTransformerConfig(
            self.d_vocab, self.n_examples, self.seq_len, self.n_copy_heads, self.dtype, self.device
        )


# --preset NAME sets these fields (explicit flags still override them). The scale recipe (README,
# "Training at scale"): init_demo ~ log L + 3 keeps each head's mass on its demonstration ~0.95 at
# init (the default 5 gives 0.94 at L=10 but 0.82 at L=32, 0.70 at L=64); init_offset 2 starts the
# copies at offset 0; copyer_lr_scale 0.3 stops the copies softening (a full W_KQ barely penalises it).
# Measured: medium reaches gap < 0.01 and TV <= 0.05 by step 1000, 32/32 distinct heads (purity 0.95);
# large leaves the plateau near step 600 and ends at gap 0.0065, TV 0.022, 64/64 distinct (purity 0.84).
PRESETS: dict[str, dict] = {
    "small": {},  # the defaults above: d=5, L=K=10, H=12
    "medium": {
        "d_vocab": 10,
        "n_examples": 32,
        "seq_len": 24,
        "init_demo": 6.5,
        "init_offset": 2.0,
        "copyer_lr_scale": 0.3,
        "steps": 1500,
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
        "steps": 3000,
        "eval_every": 100,
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
    """
    attn = model.blocks[0].attn
    K, L, H = model.cfg.n_copy_heads, model.cfg.n_examples, model.cfg.seq_len
    attn.w_H.fill_(-offset)
    attn.w_H[:, H - 1] = offset
    attn.w_L.zero_()
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

    Under ``torchrun`` each process trains on its slice of the same global batch (``models.distributed``);
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
    task = cfg.task()
    torch.manual_seed(cfg.seed)
    init_gen = torch.Generator().manual_seed(cfg.seed)
    model = model_class(cfg.task_kind)(dataclasses.replace(cfg.model_config(), device=device))
    init_copyers(model, cfg.init_offset, cfg.init_demo, init_gen)
    eval_tokens, eval_parents = task.sample(cfg.eval_contexts, torch.Generator().manual_seed(cfg.seed + 1_000_003))
    data_gen = torch.Generator().manual_seed(cfg.seed + 1)
    copyer = list(model.blocks[0].parameters())
    rest = [p for p in model.parameters() if all(p is not c for c in copyer)]
    opt = torch.optim.Adam([{"params": rest, "lr": cfg.lr}, {"params": copyer, "lr": cfg.lr * cfg.copyer_lr_scale}])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, cfg))
    history: list[dict] = []
    start = 0
    out = Path(cfg.out)
    if cfg.resume and (out / TRAIN_STATE).is_file():
        start, history = _resume(out, cfg, model, opt, sched, data_gen)
    if start == 0 and place.is_main:  # the state at initialisation, for the record (uses no randomness)
        history.append({"step": 0, "loss": None, "seconds": 0.0, **evaluate(model, task, eval_tokens, eval_parents)})
        if progress:
            tqdm.write(_describe(history[-1]))
    model.train()
    forward = distributed.wrap(model, place)
    if cfg.compile:
        forward = torch.compile(forward)
    t0 = time.perf_counter()
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, disable=not progress, desc="train")
    for step in bar:
        tokens, _ = task.sample(cfg.batch_size, data_gen)  # the global batch, the same on every rank
        tokens, target = _host_batch(distributed.shard(tokens, place), cfg.seq_len, device)
        loss = step_loss(forward, tokens, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        done = step + 1
        if done % cfg.eval_every == 0 or done == cfg.steps:
            loss = distributed.mean_over_ranks(loss, place).item()  # the only host-device sync: at evaluation
            if not place.is_main:
                continue
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
            _save(model, task, cfg, history, opt, sched, data_gen, done, out)
            if cfg.snapshot_every and done % cfg.snapshot_every == 0:
                _save(model, task, cfg, history, None, None, None, done, out / "snapshots" / f"step_{done:06d}")
    bar.close()
    return model.eval(), history


def _describe(m: dict) -> str:
    """One line of evaluation metrics."""
    return (
        f"step {m['step']:6d}  nll {m['nll']:.4f} (BMA {m['nll_bma']:.4f}, gap {m['nll_gap']:+.4f})  "
        f"TV {m['tv_to_bma']:.4f}  parent acc {m['parent_acc']:.3f} (BMA {m['parent_acc_bma']:.3f})  "
        f"heads->{m['distinct_demos']}/{len(m['head_demo'])} demos, min purity {min(m['head_purity']):.3f}"
    )


def _lr_factor(step: int, cfg: TrainConfig) -> float:
    """Cosine decay from 1 to final_lr_fraction over the run."""
    progress = min(step / cfg.steps, 1.0)
    return cfg.final_lr_fraction + (1 - cfg.final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * progress))


def _save(model, task, cfg, history, opt, sched, data_gen, step, path) -> None:
    training = {"config": asdict(cfg), "step": step, "history": history}
    if opt is None:
        save(model, path, task=task, training=training)
        return
    tensors, meta = _optimizer_state(opt)
    tensors["data_generator"] = data_gen.get_state()
    tensors["torch_rng"] = torch.get_rng_state()
    meta.update(step=step, scheduler=sched.state_dict())
    save(model, path, task=task, training=training, train_state=tensors, train_meta=meta)


def _resume(out: Path, cfg: TrainConfig, model, opt, sched, data_gen) -> tuple[int, list[dict]]:
    training = read_config(out)["training"]
    current = asdict(cfg)
    differ = {
        k for k, v in current.items() if k not in ("resume", "steps", "compile") and training["config"].get(k) != v
    }
    if differ:
        raise ValueError(f"cannot resume {out}: its training config differs in {sorted(differ)}")
    model.load_state_dict(load_checkpoint(out, device=cfg.device).state_dict())
    tensors = safetensors.torch.load_file(out / TRAIN_STATE)
    meta = json.loads((out / TRAIN_META).read_text())
    _load_optimizer_state(opt, tensors, meta)
    sched.load_state_dict(meta["scheduler"])
    data_gen.set_state(tensors["data_generator"])
    torch.set_rng_state(tensors["torch_rng"])
    return int(meta["step"]), training["history"]


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = argparse.ArgumentParser(prog="python -m models.train", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="small",
        help="model size and recipe; other flags override its fields (default: small)",
    )
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            parser.add_argument(flag, action="store_true", help=f"(default: {f.default})")
        else:
            kind = {"int": int, "float": float, "str": str, "int | None": int}[f.type]
            parser.add_argument(flag, type=kind, default=f.default, help=f"(default: {f.default})")
    preset, _ = parser.parse_known_args(argv)
    parser.set_defaults(**PRESETS[preset.preset])
    args = parser.parse_args(argv)
    try:
        return TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
    except ValueError as e:
        parser.error(str(e))


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    try:
        _, history = train(cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if history:  # rank 0 (or the only process)
        print(f"wrote {cfg.out} ({history[-1]['seconds']:.1f} s)")


if __name__ == "__main__":
    main()
