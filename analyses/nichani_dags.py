"""Nichani et al.'s headline on their own DAGs: how much layer 1 attends from a position to its parent.

    python -m analyses.nichani_dags --dags 0-19 --threads 1 --out runs/nichani_dags      # train and measure
    python -m analyses.nichani_dags --sweep docs/reproductions/nichani_dags.json         # re-plot a sweep

Their ``many_graphs.ipynb`` draws 20 DAGs (``probes.jax_random.nichani_dags``, bit for bit), trains a
CatFormer per DAG on the last token only, and reports the mean over DAGs of the attention that layer 1 puts
from each position i on its parent p(i), averaged over the DAG's edges: 0.837 +- 0.054 (the standard
deviation over the 20 DAGs). Here each DAG is a job of ``models.training.sweep.run_jobs``: ``models.standard``
(``--loss-on last``) on ``nichani_dag:index=I:kernel=dirichlet``, vocabulary 3, their T = 20 (a sequence of
21 here: the test token's child is position 20), Dirichlet(0.1) rows. Theirs reads the softmax of the
positional block of A alone; a GPT-2 has no such block, so here it is the attention pattern itself (content
included) from position i to p(i), averaged over held-out contexts and then over the DAG's edges, per head of
layer 0. What differs from theirs: roots are uniform here (theirs: the stationary distribution), a
standard GPT-2 with AdamW instead of a CatFormer with SGD, and the step budget (``--steps``).
"""

from __future__ import annotations

from analyses import common
from models.plumbing.io import UsageError
from models.training import sweep

NAME = "nichani_dags"


def add_flags(p) -> None:
    p.add_argument("--dags", default="0-19", help="which of their 20 DAGs to train: 0-19, 3 or 0,2,5 (default: 0-19)")
    p.add_argument("--steps", type=int, default=6000, help="training steps per DAG (default: 6000)")
    p.add_argument("--batch-size", type=int, default=512, help="sequences per step (default: 512)")
    p.add_argument("--n-contexts", type=int, default=256, help="held-out contexts of the attention (default: 256)")
    p.add_argument(
        "--sweep",
        default=None,
        help="re-plot this JSON (what an earlier run wrote), or the "
        f"{NAME}_partial.jsonl of a stopped one (with its --steps and --batch-size), instead of training",
    )
    sweep.add_flags(p)


REQUIRES = None  # its own synthetic tasks: no --checkpoint
N_CONTEXTS = None  # its own --n-contexts (held-out contexts of the attention)


common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import json
import time
from pathlib import Path

import numpy as np
import torch

from models.training.standard import StandardConfig, train_standard

THEIRS = {"mean": 0.83663917, "std": 0.054017633, "n_dags": 20}  # many_graphs.ipynb's printed output
TASK = dict(d_vocab=3, n_examples=0, seq_len=21, alpha=0.1)
MODEL = dict(n_layers=2, n_heads=1, d_model=64, d_mlp=128, lr=1e-3, loss_on="last")
COMMITTED = Path(__file__).resolve().parent.parent / "docs" / "reproductions" / "nichani_dags.json"
# analyses.paper re-plots the committed sweep (each DAG trains for minutes; the paper run takes minutes in all)
PAPER_ARGS = ["--sweep", str(COMMITTED)]
FIGURES = {
    f"{NAME}.png": (
        "layer 0's attention from each position to its parent after training on the last token, one bar per DAG of "
        "Nichani et al.'s 20 that ran, against their 0.837 +- 0.054 (CatFormer, 20 DAGs); re-plotted from "
        "docs/reproductions/nichani_dags.json"
    ),
}


def train_dag(index: int, steps: int, batch_size: int, seed: int, n_contexts: int) -> dict:
    """One job: train on DAG ``index``, then the layer-0 attention on each edge, per head (plain data)."""
    start = time.perf_counter()
    cfg = StandardConfig(
        **TASK, **MODEL, task_kind=f"nichani_dag:index={index}:kernel=dirichlet", steps=steps,
        batch_size=batch_size, seed=seed, eval_every=steps, eval_contexts=512,
    )  # fmt: skip
    model, history = train_standard(cfg, progress=False, save=False)
    task = cfg.task()
    tokens, _ = task.sample(n_contexts, torch.Generator().manual_seed(seed + 2_000_003))
    model.config._attn_implementation = "eager"  # SDPA returns no attention pattern
    with torch.no_grad():
        att = model(tokens, output_attentions=True).attentions  # per layer [batch, head, T, T]
    edges = [(i, ps[0]) for i, ps in enumerate(task.parents[:-2]) if ps]  # their DAG's edges (not the test token's)
    per_edge = [[[att[layer][:, h, i, p].mean().item() for i, p in edges] for h in range(att[layer].shape[1])]
                for layer in range(len(att))]  # fmt: skip
    last = history[-1]
    return {
        "index": index,
        "parents": task.parents,
        "edges": edges,
        "attention_on_parent": per_edge,  # [layer][head][edge]
        "mean_attention_on_parent": [[float(np.mean(e)) for e in layer] for layer in per_edge],
        "last_nll": last["last_nll"],
        "last_nll_bma": last["last_nll_bma"],
        "seconds": time.perf_counter() - start,
    }


def parse_dags(text: str) -> list[int]:
    """``"0-19"``, ``"3"`` or ``"0,2,5"`` -> DAG indices (one ValueError otherwise)."""
    out = []
    for part in text.split(","):
        a, dash, b = part.partition("-")
        if not (a.isdigit() and (not dash or b.isdigit())):
            raise UsageError(f"--dags {text!r}: expected indices like 0-19, 3 or 0,2,5")
        out += list(range(int(a), int(b) + 1)) if dash else [int(a)]
    if not out or min(out) < 0 or max(out) > 19 or len(set(out)) != len(out):
        raise UsageError(f"--dags {text!r}: expected distinct indices in 0..19 (their 20 DAGs)")
    return out




def check_flags(p, args) -> None:
    args.dag_list = parse_dags(args.dags)  # a ValueError is one line (common.parse)
    common.check_at_least(p, args, steps=1, batch_size=1, n_contexts=1)
    sweep.check_flags(p, args)
    if args.sweep is not None and not Path(args.sweep).is_file():
        p.error(f"--sweep {args.sweep}: no such file; expected the JSON an earlier run of analyses.{NAME} wrote")


def compute(subject, args) -> dict:
    if args.sweep is not None and args.sweep.endswith(".jsonl"):  # the DAGs a stopped sweep finished
        runs = sorted(
            (json.loads(line) for line in Path(args.sweep).read_text().splitlines()), key=lambda r: r["index"]
        )
        return {
            "runs": runs,
            "steps": args.steps,
            "batch_size": args.batch_size,
            **aggregate(runs),
            "sweep": args.sweep,
        }
    if args.sweep is not None:
        return {**json.loads(Path(args.sweep).read_text())["results"], "sweep": args.sweep}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / f"{NAME}_partial.jsonl"  # each finished DAG at once, so a stopped sweep keeps its runs

    def done(i, run):
        with partial.open("a") as f:
            f.write(json.dumps(run) + "\n")
        print(f"  DAG {run['index']}: layer-0 attention on the parent {run['mean_attention_on_parent'][0]} "
              f"({run['seconds']:.0f} s)", flush=True)  # fmt: skip

    kwargs = [dict(index=i, steps=args.steps, batch_size=args.batch_size, seed=args.seed, n_contexts=args.n_contexts)
              for i in args.dag_list]  # fmt: skip
    runs = sweep.run_jobs(train_dag, kwargs, args.cluster, args.jobs, on_done=done)
    return {"runs": runs, "steps": args.steps, "batch_size": args.batch_size, **aggregate(runs)}


def aggregate(runs: list[dict]) -> dict:
    """Mean over DAGs and standard deviation over DAGs (NumPy's, as theirs) of L0H0's per-DAG mean."""
    per_dag = np.array([r["mean_attention_on_parent"][0][0] for r in runs])
    return {"n_dags": len(runs), "mean": float(per_dag.mean()), "std": float(per_dag.std()), "theirs": THEIRS}


def figures(res: dict, args):
    import matplotlib.pyplot as plt

    runs = res["runs"]
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    idx = [r["index"] for r in runs]
    ax.bar(idx, [r["mean_attention_on_parent"][0][0] for r in runs], color="tab:blue", label="ours (GPT-2, L0H0)")
    ax.axhline(res["mean"], color="tab:blue", ls="--", lw=1, label=f"ours: {res['mean']:.3f} ± {res['std']:.3f}")
    ax.axhspan(THEIRS["mean"] - THEIRS["std"], THEIRS["mean"] + THEIRS["std"], color="tab:orange", alpha=0.25,
               label=f"theirs (CatFormer): {THEIRS['mean']:.3f} ± {THEIRS['std']:.3f}")  # fmt: skip
    ax.set(xlabel="their DAG (index into many_graphs.ipynb's 20)", ylabel="attention on the parent",
           ylim=(0, 1.02), xticks=range(20))  # fmt: skip
    ax.set_title(f"Layer-1 attention from i to p(i), {len(runs)} of their 20 DAGs", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, fontsize=8, frameon=False)
    return {NAME: fig}


def summary(res: dict) -> str:
    lines = [f"{NAME}: {res['n_dags']} of their 20 DAGs; L0H0's attention on the parent {res['mean']:.3f} +- "
             f"{res['std']:.3f} (theirs {THEIRS['mean']:.3f} +- {THEIRS['std']:.3f})"]  # fmt: skip
    for r in res["runs"]:
        lines.append(f"  DAG {r['index']:2d}: {len(r['edges'])} edges, per head of layer 0 "
                     f"{[round(m, 3) for m in r['mean_attention_on_parent'][0]]}, last-token NLL "
                     f"{r['last_nll']:.4f} (Bayes {r['last_nll_bma']:.4f})")  # fmt: skip
    return "\n".join(lines)


ANALYSIS = common.register(globals())
