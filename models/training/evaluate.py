"""A trained model's metrics on held-out contexts: what training reports every ``eval_every`` steps, and
``python -m models.evaluate`` measures after the fact.

    python -m models.evaluate --checkpoint runs/medium            # 4096 fresh contexts, seed 12345
    python -m models.evaluate --checkpoint default --n-contexts 8192 --seed 1 --json out.json

The NLL gap to BMA, the mean TV between the layer-2 attention and the BMA posterior, parent accuracy
beside BMA's and the copyer-head assignment, on contexts drawn from the checkpoint's own task with a
seed that training does not use (its data and eval seeds derive from ``seed``), in chunks of
``--batch-size`` so large models fit in memory.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor

from models import cli
from models.interp.subject import DisentangledSubject, check_finite
from models.nets.causal_transformer import CausalTransformer
from models.nets.continuous import bma_nll, gaussian_nll
from probes import head_assignment, mean_tv, parent_accuracy, target_nll
from probes.continuous import ContinuousTask, gaussian_bma_posterior, predictive_mean, target_mse
from probes.metrics import parent_set_accuracy, per_context_nll
from probes.oracles import bayes

EVAL_SEED = 12345  # fresh contexts: training derives its data and eval seeds from its own seed


def output_and_pattern(model: CausalTransformer, inputs) -> tuple[Tensor, Float[Tensor, "batch H H"]]:
    """The model's output and its blocks.1 attention (float64, CPU), in eval mode, training mode restored."""
    was_training = model.training
    model.eval()
    out, cache = model.run_with_cache(inputs, names_filter="blocks.1.attn.hook_pattern")
    model.train(was_training)
    check_finite(out, "the model")
    return out, cache["blocks.1.attn.hook_pattern"][:, 0].double().cpu()


def eval_metrics(model: CausalTransformer, nll: float, nll_bma: float, attention, posterior, parents) -> dict:
    """The evaluation record shared by every task kind: NLL gap, TV to the BMA posterior, parent
    accuracy beside BMA's, and the copyer head assignment."""
    demos, purity = head_assignment(model.copyer_pattern().detach().cpu(), model.cfg.n_examples)
    # several parents, or parentless positions past the root (family tasks): a hit is any parent
    accuracy = parent_set_accuracy if parents.ndim == 3 or (parents[:, 1:] < 0).any() else parent_accuracy
    return {
        "nll": nll,
        "nll_bma": nll_bma,
        "nll_gap": nll - nll_bma,
        "tv_to_bma": mean_tv(attention, posterior),
        "parent_acc": accuracy(attention, parents),
        "parent_acc_bma": accuracy(posterior, parents),
        "head_demo": demos,
        "head_purity": purity,
        "distinct_demos": len(set(demos)),
    }


@torch.no_grad()
def evaluate(model: CausalTransformer, task, inputs, parents) -> dict:
    """Held-out metrics of the disentangled model on any task kind. Discrete tasks: NLL (h >= 1) of the
    model and of the task's Bayes oracle (``probes.oracles.bayes``; ours: BMA); on a fixed graph the
    "posterior" is the graph itself, where the parents are, which under a per-context kernel is not where
    an optimal layer 2 attends (an induction head attends to earlier tokens that followed the same parent
    values). Continuous task: ``nll`` is the Gaussian NLL of the target under the model's mean
    and the known noise variance, ``nll_bma`` BMA's exact mixture NLL, plus ``mse`` and ``mse_bma``."""
    out, attention = output_and_pattern(model, inputs)
    if not isinstance(task, ContinuousTask):
        bma, posterior = bayes(task, inputs.cpu())
        metrics = eval_metrics(
            model, target_nll(out.cpu(), inputs), target_nll(bma, inputs), attention, posterior, parents
        )
        gaps = per_context_nll(out.cpu(), inputs) - per_context_nll(bma, inputs)  # [batch]
        if len(gaps) > 1:  # one context has no standard error: none is written (never NaN)
            metrics["nll_gap_se"] = (gaps.std() / len(gaps) ** 0.5).item()
        return metrics
    posterior = gaussian_bma_posterior(task, inputs)
    metrics = eval_metrics(
        model, gaussian_nll(out.cpu(), inputs, task), bma_nll(task, inputs), attention, posterior, parents
    )
    metrics["mse"] = target_mse(out.cpu(), inputs, task.seq_len)
    metrics["mse_bma"] = target_mse(predictive_mean(task, inputs, posterior), inputs, task.seq_len)
    return metrics


def evaluate_subject(subject: DisentangledSubject, n_contexts: int, seed: int, batch_size: int) -> dict:
    """``evaluate`` over ``n_contexts`` fresh contexts, averaged over chunks (weighted by size); the gap's
    standard error is that of all the contexts together (``pooled_se``: the chunks' means and standard
    errors give it exactly); the head assignment is the model's, the same for every chunk."""
    g = torch.Generator().manual_seed(seed)
    total, sums, chunks, last = 0, {}, [], {}
    for start in range(0, n_contexts, batch_size):
        n = min(batch_size, n_contexts - start)
        tokens, parents = subject.task.sample(n, g)
        last = evaluate(subject.model, subject.task, tokens.to(subject.model.cfg.device), parents)
        for key, value in last.items():
            if isinstance(value, float) and key != "nll_gap_se":
                sums[key] = sums.get(key, 0.0) + n * value
        chunks.append((n, last["nll_gap"], last.get("nll_gap_se", 0.0)))
        total += n
    means = {key: value / total for key, value in sums.items()}
    means.pop("nll_gap_se", None)
    se = pooled_se(chunks)
    discrete = not isinstance(subject.task, ContinuousTask)
    if discrete and se is not None:
        means["nll_gap_se"] = se
    return {**{k: v for k, v in last.items() if k != "nll_gap_se"}, **means, "n_contexts": total, "seed": seed}


def pooled_se(chunks: list[tuple[int, float, float]]) -> float | None:
    """The standard error of the mean over every value of chunks given as (count, mean, standard error of
    the mean; 0 for a chunk of one): the within-chunk and between-chunk sums of squares added. None for
    fewer than two values."""
    total = sum(n for n, _, _ in chunks)
    if total < 2:
        return None
    mean = sum(n * m for n, m, _ in chunks) / total
    squares = sum((n - 1) * n * se**2 + n * (m - mean) ** 2 for n, m, se in chunks)
    return math.sqrt(squares / (total - 1) / total)


def _se(m: dict) -> str:
    """`` +- SE`` of the gap where there is one (not for the continuous task)."""
    se = m.get("nll_gap_se")
    return f" +- {se:.4f}" if se is not None and math.isfinite(se) else ""


def main(argv: list[str] | None = None) -> dict:
    parser = cli.parser("python -m models.evaluate", __doc__)
    cli.add_subject_flags(parser)
    cli.add_run_flags(parser, seed=EVAL_SEED, n_contexts=4096)
    parser.add_argument("--batch-size", type=int, default=1024, help="contexts per chunk (default: 1024)")
    cli.add_json_flags(parser, "the metrics and the command")
    args = parser.parse_args(argv)
    cli.check_run_flags(parser, args, argv)  # --batch-size and --json included
    subject = cli.subject_or_exit(parser, args)
    if not isinstance(subject, DisentangledSubject):
        parser.error(
            f"--checkpoint {args.checkpoint} is a {subject.family} model: models.evaluate reports the disentangled "
            f"model's training targets; use python -m analyses.inspect --checkpoint {args.checkpoint}"
        )
    m = evaluate_subject(subject, args.n_contexts, args.seed, args.batch_size)
    print(
        f"{args.checkpoint}: {m['n_contexts']} fresh contexts (seed {m['seed']}): NLL {m['nll']:.4f} "
        f"(BMA {m['nll_bma']:.4f}, gap {m['nll_gap']:+.4f}{_se(m)}), TV {m['tv_to_bma']:.4f}, parent acc "
        f"{m['parent_acc']:.3f} (BMA {m['parent_acc_bma']:.3f}), heads -> {m['distinct_demos']}/"
        f"{len(m['head_demo'])} distinct demos, min purity {min(m['head_purity']):.3f}"
    )
    if args.json:
        cli.write_json_output(args, {"command": args.command, **m}, parser.prog)
    return m


if __name__ == "__main__":
    cli.run_cli(main, prog="python -m models.evaluate")
