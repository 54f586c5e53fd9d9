"""Evaluate a checkpoint on fresh contexts: the training targets' metrics, measured after the fact.

    python -m models.evaluate runs/medium                      # 4096 fresh contexts, seed 12345
    python -m models.evaluate default --n-contexts 8192 --seed 1 --json out.json

Prints the NLL gap to BMA, the mean TV between the layer-2 attention and the BMA posterior, parent
accuracy beside BMA's and the copyer-head assignment (``models.train.evaluate``), on contexts drawn from
the checkpoint's own task with a seed that training does not use (its data and eval seeds derive from
``seed``), in chunks of ``--batch-size`` so large models fit in memory.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from analyses.common import _atomic_write, load_subject, run
from models.train import evaluate


def evaluate_checkpoint(subject, n_contexts: int, seed: int, batch_size: int) -> dict:
    """``models.train.evaluate`` over ``n_contexts`` fresh contexts, averaged over chunks (weighted by size);
    the head assignment is the model's, the same for every chunk."""
    g = torch.Generator().manual_seed(seed)
    total, sums, last = 0, {}, {}
    for start in range(0, n_contexts, batch_size):
        n = min(batch_size, n_contexts - start)
        tokens, parents = subject.task.sample(n, g)
        last = evaluate(subject.model, subject.task, tokens.to(subject.model.cfg.device), parents)
        for key, value in last.items():
            if isinstance(value, float):
                sums[key] = sums.get(key, 0.0) + n * value
        total += n
    return {**last, **{key: value / total for key, value in sums.items()}, "n_contexts": total, "seed": seed}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m models.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="checkpoint folder, 'default' or 'theorem1:beta=B'")
    parser.add_argument("--n-contexts", type=int, default=4096, help="fresh contexts (default: 4096)")
    parser.add_argument("--seed", type=int, default=12345, help="seed of the contexts (default: 12345)")
    parser.add_argument("--batch-size", type=int, default=1024, help="contexts per chunk (default: 1024)")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument("--json", help="also write the metrics to this JSON file")
    args = parser.parse_args(argv)
    if args.n_contexts < 1 or args.batch_size < 1:
        parser.error(f"--n-contexts and --batch-size must be >= 1, got {args.n_contexts} and {args.batch_size}")
    try:
        subject = load_subject(args.checkpoint, args.device)
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))
    m = evaluate_checkpoint(subject, args.n_contexts, args.seed, args.batch_size)
    print(
        f"{args.checkpoint}: {m['n_contexts']} fresh contexts (seed {m['seed']}): NLL {m['nll']:.4f} "
        f"(BMA {m['nll_bma']:.4f}, gap {m['nll_gap']:+.4f}), TV {m['tv_to_bma']:.4f}, parent acc "
        f"{m['parent_acc']:.3f} (BMA {m['parent_acc_bma']:.3f}), heads -> {m['distinct_demos']}/"
        f"{len(m['head_demo'])} distinct demos, min purity {min(m['head_purity']):.3f}"
    )
    if args.json:
        _atomic_write(Path(args.json), lambda tmp: tmp.write_text(json.dumps(m, indent=1) + "\n"))
    return m


if __name__ == "__main__":
    run(main)
