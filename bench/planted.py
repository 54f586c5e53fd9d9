"""Circuit discovery scored against a circuit known in advance: the shipped 2-layer GPT-2 planted in deeper,
wider GPT-2s among distractor heads and MLPs that read and write (``bench.deepened`` with ``noise``), the
circuit ``discover`` finds compared with the planted heads.

    python -m bench.planted runs/planted                       # depths 4, 8, 12; width 96, 12 heads; 2 seeds
    python -m bench.planted runs/planted --depths 12 --n-head 12 --n-embd 768 --vocab-size 50257 --seeds 0

Per model: the precision of the heads chosen (the share that are planted), their recall of the audited heads
(the small model's heads whose mean ablation alone costs more than 3 standard errors, measured on the small
model by ``by_hand_values``, not by the suite), the ROC AUC of the suite's ranking of every head (its exact
cost where every head has one, else its attribution) against the planted labels, and the circuit's
sufficiency on the held-out contexts twice: as the suite reports it, and recomputed by ``by_hand_values`` with
plain torch hooks on the Hugging Face model (every head and MLP outside the circuit set to its mean over the
same reference contexts), which must agree within 2 standard errors. Writes ``planted.json`` and prints the
table of docs/results/circuit.md.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from bench.deepened import deepen, planted_nodes
from models import STANDARD_CHECKPOINT
from models.plumbing.io import write_json


def by_hand_values(hf, subject, tokens, ablated: list[str], reference) -> torch.Tensor:
    """Per context of ``tokens`` ``[batch, T]`` (the task's), the suite's metric (``per_context_nll`` at every
    target position) with the heads and MLPs named in ``ablated`` (``L{i}H{j}``, ``MLP{i}``) each set to its
    mean over ``reference``, position by position, computed with plain torch hooks on ``hf`` (the Hugging Face
    ``GPT2LMHeadModel``): a head's slice of ``c_proj``'s input, an MLP's output. No TransformerLens."""
    from probes.metrics import per_context_nll

    blocks, layout = hf.transformer.h, subject.layout
    dh = hf.config.n_embd // hf.config.n_head
    heads: dict[int, list[int]] = {}
    mlps = [int(n[3:]) for n in ablated if n.startswith("MLP")]
    for n in ablated:
        if n.startswith("L"):
            i, j = map(int, n[1:].split("H"))
            heads.setdefault(i, []).append(j)

    def run(ids, hooks):
        handles = [m.register_forward_pre_hook(f) if pre else m.register_forward_hook(f) for m, f, pre in hooks]
        try:
            with torch.no_grad():
                return hf(ids).logits
        finally:
            for h in handles:
                h.remove()

    store: dict = {}
    record = [(blocks[i].attn.c_proj, lambda m, x, i=i: store.__setitem__(("z", i), x[0]), True) for i in heads]
    record += [(blocks[i].mlp, lambda m, x, o, i=i: store.__setitem__(("mlp", i), o), False) for i in mlps]
    run(layout.encode(reference), record)
    means = {k: v.double().mean(0).float() for k, v in store.items()}

    def set_heads(m, x, i):
        z = x[0].clone()
        for j in heads[i]:
            z[..., j * dh : (j + 1) * dh] = means[("z", i)][..., j * dh : (j + 1) * dh]
        return (z,)

    hooks = [(blocks[i].attn.c_proj, lambda m, x, i=i: set_heads(m, x, i), True) for i in heads]
    hooks += [(blocks[i].mlp, lambda m, x, o, i=i: means[("mlp", i)].expand_as(o), False) for i in mlps]
    logits = run(layout.encode(tokens), hooks)
    first, d = layout.token_offset, subject.task.d_vocab
    log_probs = logits[:, layout.prediction_positions(), first : first + d].double().log_softmax(-1)
    return per_context_nll(log_probs, tokens)


def audited_heads(source: Path, n_contexts: int = 512, seed: int = 0, z: float = 3.0) -> list[str]:
    """The heads of the small GPT-2 ``source`` whose mean ablation alone (``by_hand_values``; the mean over
    ``n_contexts`` other contexts) costs more than ``z`` standard errors over ``n_contexts`` contexts, the
    costliest first."""
    from transformers import GPT2LMHeadModel

    import models

    subject, hf = models.load_subject(str(source)), GPT2LMHeadModel.from_pretrained(str(source)).eval()
    tokens = subject.task.sample(n_contexts, torch.Generator().manual_seed(seed))[0]
    reference = subject.task.sample(n_contexts, torch.Generator().manual_seed(seed + 1))[0]
    clean = by_hand_values(hf, subject, tokens, [], reference)
    out = {}
    for i in range(hf.config.n_layer):
        for j in range(hf.config.n_head):
            cost = by_hand_values(hf, subject, tokens, [f"L{i}H{j}"], reference) - clean
            if cost.mean() > z * cost.std() / math.sqrt(len(cost)):
                out[f"L{i}H{j}"] = cost.mean().item()
    return sorted(out, key=lambda h: -out[h])


def roc_auc(scores: dict[str, float], positive: set[str]) -> float:
    """The probability that a positive (``positive``) outscores a negative, ties counting half (Mann-Whitney)."""
    pos = [v for k, v in scores.items() if k in positive]
    neg = [v for k, v in scores.items() if k not in positive]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def place(label: str, at: tuple[int, ...]) -> str:
    """A head of the small model (``L{i}H{j}``) as the planted model has it: its layer i at ``at[i]``."""
    i, j = map(int, label[1:].split("H"))
    return f"L{at[i]}H{j}"


def evaluate(folder: Path, source: Path, at: tuple[int, ...], audited: list[str], config) -> dict:
    """``discover`` on the planted model in ``folder`` with ``config``, scored against the planted heads."""
    from transformers import GPT2LMHeadModel

    import models
    from models.interp.circuit import discover
    from models.interp.circuit.discovery import SEEDS, sample

    subject = models.load_subject(str(folder))
    n_layer = json.loads((folder / "config.json").read_text())["n_layer"]
    planted = set(planted_nodes(source, n_layer, at))
    wall, cpu = time.perf_counter(), time.process_time()
    result = discover(subject, config)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    r = result.to_dict()
    chosen = [n for n in r["nodes"] if n.startswith("L")]
    audit = {place(h, at) for h in audited}
    ranks = r.get("node_attribution") or r["node_costs"]  # every node's first-order cost at the level of nodes
    ranks = r["node_costs"] if len(r["node_costs"]) == len(ranks) else ranks
    ranking = {n: abs(v["cost"]) for n, v in ranks.items() if n.startswith("L")}
    hf = GPT2LMHeadModel.from_pretrained(str(folder)).eval()
    held = sample(subject.task, r["n_held_out"], config.seed + SEEDS["held_out"])
    reference = sample(subject.task, r["n_mean_reference"], config.seed + SEEDS["reference"])
    from models.interp.baselines import per_context_baselines

    plateau, _ = per_context_baselines(subject.task, held, r["positions"])
    everything = [n for n in ranking] + [f"MLP{i}" for i in range(n_layer)]
    full = by_hand_values(hf, subject, held, [], reference)
    ablated = by_hand_values(hf, subject, held, [n for n in everything if n not in set(r["nodes"])], reference)
    by_hand = float((plateau - ablated).mean() / (plateau - full).mean())
    return {
        "folder": str(folder), "level": r.get("level", "edges"), "scored_with": r.get("scored_with", r["method"]),
        "heads": len(ranking), "planted_heads": len([n for n in planted if n.startswith("L")]),
        "chosen_heads": chosen, "precision": sum(n in planted for n in chosen) / max(len(chosen), 1),
        "recall": sum(n in set(chosen) for n in audit) / max(len(audit), 1), "audited": sorted(audit),
        "recall_top5": sum(place(h, at) in set(chosen) for h in audited[:5]) / min(5, max(len(audited), 1)),
        "auc": roc_auc(ranking, planted), "edges": len(r["edges"]), "nodes": r["nodes"],
        "sufficiency": r["held_out"]["sufficiency_mean"], "sufficiency_se": r["held_out"]["sufficiency_mean_se"],
        "sufficiency_by_hand": by_hand, "n_held_out": r["n_held_out"], "wall_s": wall, "cpu_s": cpu,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    from models.interp.circuit import CircuitConfig

    p = argparse.ArgumentParser(prog="python -m bench.planted", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="folder for the planted models and planted.json")
    p.add_argument("--depths", type=int, nargs="+", default=[4, 8, 12])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--n-head", type=int, default=12)
    p.add_argument("--n-embd", type=int, default=96)
    p.add_argument("--vocab-size", type=int, default=1000)
    p.add_argument("--noise", type=float, default=1.0, help="the distractors' writes: GPT-2's initialisation times this")
    a = p.parse_args(argv)
    source = Path(STANDARD_CHECKPOINT)
    audited = audited_heads(source)
    rows = []
    for depth in a.depths:
        for seed in a.seeds:
            at = tuple(sorted(torch.randperm(depth, generator=torch.Generator().manual_seed(seed))[:2].tolist()))
            folder = a.out / f"depth{depth}_seed{seed}"
            deepen(source, folder, depth, a.n_head, a.n_embd, a.vocab_size, at=at, seed=seed, noise=a.noise)
            row = {"depth": depth, "seed": seed, "at": at, **evaluate(folder, source, at, audited, CircuitConfig(seed=seed))}
            rows.append(row)
            print(f"| {depth} | {a.n_embd} | {seed} | {row['level']} | {len(row['chosen_heads'])} | "
                  f"{row['precision']:.2f} | {row['recall_top5']:.2f} | {row['recall']:.2f} | {row['auc']:.3f} | {row['sufficiency']:.3f} +- "
                  f"{row['sufficiency_se']:.3f} | {row['sufficiency_by_hand']:.3f} | {row['cpu_s']:.0f} |", flush=True)
            write_json(a.out / "planted.json", {"audited": audited, "rows": rows})


if __name__ == "__main__":
    main()
