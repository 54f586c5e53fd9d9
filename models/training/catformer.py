"""Nichani et al.'s CatFormer (``models.nets.catformer``) trained as their ``many_graphs.ipynb`` trains it:

    cfg = CatFormerTrainConfig(task_kind="nichani_dag:index=3:kernel=dirichlet:root=stationary", steps=4096)
    model, history = train_catformer(cfg)          # history: their test loss, Bayes' and their measure
    save_catformer(model, "runs/catformer", cfg, history)   # catformer.npz, task.json, training.json

Their recipe, read from the notebook: heads [1, 1], every weight zero at the start, plain SGD
(``optax.sgd(learning_rate=1.)``: no momentum; the weight decay ``wd = 2e-4`` they define is never used),
2^14 steps of 2^10 fresh sequences, and the loss on the last position only, as a cross-entropy against the
true distribution of the token it predicts (``-log f(x) . pi[test_token]``), not against a drawn token.
Here a sequence is the task's (T + 1 tokens: their T inputs and the token their read-out predicts, whose
true distribution, the row of its context's kernel at its parents' values, is the target); the CatFormer
reads the first T. Their DAGs are ``nichani_dag:index=I:kernel=dirichlet:root=stationary``
(``probes.graph_task``): roots from each context's stationary distribution, their test token uniform.

Evaluation (``history``, every ``eval_every`` steps, on ``eval_contexts`` held-out contexts): the loss they
print (``last_nll``), Bayes' on the same targets (``last_nll_bayes``: add-alpha counts of the transitions in
the context, their ``problem.bayes``; it reads no root, as theirs) and, on a fixed graph, their measure of
layer 0 (``parent_attention``: ``probes.metrics.dag_parent_mass`` of ``CatFormer.positional_attention``).
The model's loss positions are the last token's (``LOSS_ON``): its read-out is the last position's alone.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from models.loading.checkpoint import write_folder_atomically
from models.loading.sources.files import TASK_JSON
from models.nets.catformer import CatFormer, CatFormerConfig
from models.plumbing.io import check_memory, size
from models.training.optim import check_finite
from probes import oracles
from probes.graph_task import GraphTask, make_task, parent_rows
from probes.metrics import dag_parent_mass
from probes.tasks import check_float, check_int

WEIGHTS = "catformer.npz"  # the file models.loading.sources.catformer reads (their pytree's leaves)
TRAINING_JSON = "training.json"
LOSS_ON = "last"  # their read-out is the last position's: the only position any CatFormer is trained on
MAX_STEPS = 2**24


@dataclass
class CatFormerTrainConfig:
    """Their ``many_graphs.ipynb`` settings by default (module docstring)."""

    task_kind: str = "nichani_dag:index=0:kernel=dirichlet:root=stationary"  # a task of probes.graph_task
    d_vocab: int = 3  # their vocab_size
    seq_len: int = 21  # T + 1: their seq_len T = 20 inputs, then the token the read-out predicts
    alpha: float = 0.1  # Dirichlet concentration of each context's kernel rows
    heads: list[int] = field(default_factory=lambda: [1, 1])
    steps: int = 2**14
    batch_size: int = 2**10
    lr: float = 1.0  # plain SGD
    seed: int = 0  # the training data; the weights start at zero, as theirs
    eval_every: int = 1024
    eval_contexts: int = 4096  # theirs: 2^16
    sample_batches: int = 16  # training batches drawn at once (fewer, larger calls of the sampler)

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every", "eval_contexts", "sample_batches"):
            check_int(getattr(self, name), name, 1, MAX_STEPS)
        check_int(self.seed, "seed", 0, 2**62)
        check_float(self.lr, "lr", 0, 1e3, open_low=True)
        if not isinstance(self.heads, list) or not self.heads or not all(isinstance(n, int) and n >= 1 for n in self.heads):
            raise ValueError(f"heads must be a non-empty list of positive integers, got {self.heads!r}")
        task = self.task()
        if not isinstance(task, GraphTask):
            raise ValueError(
                f"task_kind {self.task_kind!r}: the CatFormer trainer needs a task of the family (probes.graph_task), "
                "whose kernel gives the true distribution of the last token"
            )
        if task.n_examples != 0:
            raise ValueError(f"a CatFormer reads one sequence (n_examples 0, as theirs); got {task.n_examples}")

    def task(self):
        return make_task(self.task_kind, self.d_vocab, 0, self.seq_len, self.alpha)

    def model_config(self) -> CatFormerConfig:
        return CatFormerConfig(d_vocab=self.d_vocab, n_ctx=self.seq_len - 1, heads=list(self.heads))


def draw(task: GraphTask, batch: int, generator: torch.Generator) -> tuple[Int[Tensor, "batch T1"], Float[Tensor, "batch d"]]:
    """``batch`` contexts ``[batch, T + 1]`` and the true distribution of each one's last token (the row of its
    own kernel at its parents' values; their ``y = pi[test_token]``), float32."""
    tables = task.sample_kernels(batch, generator)
    tokens, _ = task.sample(batch, generator, kernels=tables)
    H, k = task.seq_len, len(task.parents[-1])
    if k == 0:
        return tokens, task.root.expand(batch, -1).float()
    ps = torch.tensor(task.parents[-1]).expand(batch, k)
    row = parent_rows(tokens.view(batch, 1, H), ps, task.d_vocab)[:, 0]
    return tokens, tables[k][torch.arange(batch), row].float()


def expected_nll(logits: Float[Tensor, "batch d"], target: Float[Tensor, "batch d"]) -> Tensor:
    """Their criterion: ``-log softmax(logits) . target``, averaged over contexts (nats)."""
    return -(logits.log_softmax(-1) * target).sum(-1).mean()


@torch.no_grad()
def evaluate(model: CatFormer, task: GraphTask, tokens, target, bayes_last) -> dict:
    """Their test loss, Bayes' (``bayes_last``: its last-row log-probabilities) and, on a fixed graph, their
    measure of layer 0, head 0."""
    T = model.cfg.n_ctx
    out = {"last_nll": expected_nll(model.last_logits(tokens[:, :T]).double(), target).item()}
    out["last_nll_bayes"] = -(bayes_last * target).sum(-1).mean().item()
    out["parent_attention"] = dag_parent_mass(model.positional_attention(0, 0), task.parents)
    return out


def bayes_last_row(task: GraphTask, tokens: Int[Tensor, "batch T1"]) -> Float[Tensor, "batch d"]:
    """Bayes' log-probabilities of the last token from the transitions in the context (``probes.oracles``);
    the roots read as uninformative (their ``problem.bayes``, add-alpha counts), whatever drew them."""
    plain = dataclasses.replace(task, stationary_root=False)
    return oracles.bayes(plain, tokens)[0][:, -1].double()


def check_resources(cfg: CatFormerTrainConfig) -> None:
    """One line if a training step would not fit in memory (estimated before anything is built: the drawn
    batches, and per context each layer's residual, its heads' scores, patterns and copies, kept for backward)."""
    widths, T = cfg.model_config().widths(), cfg.seq_len - 1
    per = 4 * T * sum(w + n * (3 * T + 2 * w) for n, w in zip(cfg.heads, widths)) + 8 * cfg.d_vocab**2 * 4
    check_memory(per * cfg.batch_size * 3, f"--batch-size {cfg.batch_size} ({size(per)} a context)")
    check_memory(per * cfg.eval_contexts, f"--eval-contexts {cfg.eval_contexts} ({size(per)} a context)")
    check_memory(16 * T * cfg.batch_size * cfg.sample_batches, "the drawn training batches")


def train_catformer(cfg: CatFormerTrainConfig, progress: bool = False) -> tuple[CatFormer, list[dict]]:
    """Train from zero weights with SGD on fresh contexts; returns the model (float32, eval mode) and the
    evaluation history (``evaluate``'s entries with ``step``, ``loss`` and ``seconds``). A function of the config
    and the torch thread count."""
    check_resources(cfg)
    task = cfg.task()
    model = CatFormer(cfg.model_config())  # their init: every weight zero
    eval_tokens, eval_target = draw(task, cfg.eval_contexts, torch.Generator().manual_seed(cfg.seed + 1_000_003))
    bayes_last = bayes_last_row(task, eval_tokens)
    eval_target = eval_target.double()
    g = torch.Generator().manual_seed(cfg.seed + 1)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    T, B = cfg.seq_len - 1, cfg.batch_size
    history = [{"step": 0, "loss": None, "seconds": 0.0, **evaluate(model, task, eval_tokens, eval_target, bayes_last)}]
    t0 = time.perf_counter()
    for step in (bar := tqdm(range(cfg.steps), disable=not progress or None, desc="train CatFormer")):
        j = step % cfg.sample_batches
        if j == 0:
            tokens, target = draw(task, B * cfg.sample_batches, g)
        loss = expected_nll(model.last_logits(tokens[j * B : (j + 1) * B, :T]), target[j * B : (j + 1) * B])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        done = step + 1
        if done % cfg.eval_every == 0 or done == cfg.steps:
            check_finite(model, loss.item(), done)
            m = {"step": done, "loss": loss.item(), "seconds": time.perf_counter() - t0}
            history.append({**m, **evaluate(model, task, eval_tokens, eval_target, bayes_last)})
            bar.set_postfix(gap=f"{history[-1]['last_nll'] - history[-1]['last_nll_bayes']:+.4f}")
    bar.close()
    return model.eval(), history


FILES = {WEIGHTS, TASK_JSON, TRAINING_JSON}


def save_catformer(
    model: CatFormer, out: str | Path, cfg: CatFormerTrainConfig, history: list[dict], replace: bool = False
) -> Path:
    """Write ``out`` atomically: ``catformer.npz`` (their leaves ``A.0``, ``A.1``, ..., ``W``, as their one-line
    export), ``task.json`` and ``training.json`` (the config, ``loss_on``, the history). Refuses a folder that
    is not empty, unless ``replace`` and it is an earlier such save (these three files and nothing else)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not (replace and out.is_dir() and {f.name for f in out.iterdir()} == FILES):
            raise ValueError(f"{out} exists and is not an empty folder (or a CatFormer saved here); refusing to replace it")
        for f in FILES:
            (out / f).unlink()
    training = {"config": asdict(cfg), "loss_on": LOSS_ON, "threads": torch.get_num_threads(), "history": history}

    def write(folder: Path) -> None:
        leaves = {f"A.{i}": b.attn.A.detach().float().cpu().numpy() for i, b in enumerate(model.blocks)}
        np.savez(folder / WEIGHTS, W=model.W.detach().float().cpu().numpy(), **leaves)
        (folder / TASK_JSON).write_text(json.dumps(cfg.task().to_dict(), indent=1) + "\n")
        (folder / TRAINING_JSON).write_text(json.dumps(training, indent=1) + "\n")

    write_folder_atomically(out, write)
    return out
