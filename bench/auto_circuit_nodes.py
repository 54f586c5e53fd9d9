"""Our node attribution beside auto-circuit 1.0.1's EAP of nodes, on a model of any size (a planted GPT-2-small
shape: ``bench.deepened --noise 1``), the same contexts and corruption, timed and sized side by side. Imported by
nothing; two steps, two environments (as ``bench.auto_circuit_compare``):

    python -m bench.auto_circuit_nodes export MODEL_DIR runs/acn                  # ours (this environment)
    tl2/bin/python bench/auto_circuit_nodes.py compare MODEL_DIR runs/acn       # auto-circuit's (TransformerLens 2.x)

Step 1 writes the 128 search contexts of ``discover`` (seed 0) and their ``demonstrations`` counterparts, and our
first-order cost of each head and MLP set to its output on the corrupted context (``nodes.node_attribution``,
a part of 16 contexts at a time), with its wall and CPU seconds and the process's peak RSS. Step 2 makes
TransformerLens 2.x's model from the same Hugging Face folder, patchable by auto-circuit at the level of nodes
(``patchable_model(factorized=False)``), and takes the gradient of our metric with respect to every patch mask at
0, the corrupted run's activations patched in (auto-circuit's EAP, ``mask_gradient_prune_scores``' mechanism,
one backward pass over the 128 contexts): a node's score is its edges' summed. It prints both rankings' first ten
nodes, the largest difference of a node's score, and each side's seconds and peak RSS.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from functools import partial
from pathlib import Path

N_CONTEXTS, SEED, CORRUPTION, PART = 128, 0, "demonstrations", 16


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GB (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def export(model_dir: Path, out: Path) -> None:
    """Step 1, in this repository's environment."""
    import torch

    from bench.auto_circuit_compare import contexts_record
    from models import load_subject
    from models.interp.circuit import build_graph, other_contexts
    from models.interp.circuit.nodes import node_attribution, node_outputs, output_grads, output_hooks, record_outputs
    from probes.metrics import per_context_nll

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    subject = load_subject(str(model_dir))
    graph = build_graph(subject)
    tokens = subject.task.sample(N_CONTEXTS, torch.Generator().manual_seed(SEED))[0]
    corrupted = other_contexts(subject.task, tokens, CORRUPTION, SEED)
    hooks = output_hooks(node_outputs(subject, graph))
    metric = partial(per_context_nll, positions=subject.scored_positions())  # discover's: the positions trained on
    wall, cpu = time.perf_counter(), time.process_time()
    parts = []
    for i in range(0, N_CONTEXTS, PART):
        clean, grads = output_grads(subject, graph, tokens[i : i + PART], metric)
        value = record_outputs(subject, corrupted[i : i + PART], hooks)
        parts.append(node_attribution(subject, graph, clean, grads, value))
    ours = {str(n): torch.cat([p[n] for p in parts]).mean().item() for n in parts[0]}
    record = {**contexts_record(subject, tokens, corrupted), "ours": ours,
              "ours_time": {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                            "peak_rss_gb": peak_rss_gb()}}  # fmt: skip
    (out / "nodes.json").write_text(json.dumps(record))
    print(f"wrote {out / 'nodes.json'}: {len(ours)} nodes, {record['ours_time']['cpu_s']:.1f} s CPU, "
          f"peak RSS {record['ours_time']['peak_rss_gb']:.2f} GB")  # fmt: skip


def compare(model_dir: Path, folder: Path) -> None:
    """Step 2, with TransformerLens 2.x and auto-circuit 1.0.1 (``tl2/bin/python``)."""
    import torch as t
    from auto_circuit.utils.ablation_activations import src_ablations
    from auto_circuit.utils.graph_utils import patch_mode, patchable_model, set_all_masks, train_mask_mode
    from auto_circuit_compare import _metric, tl2_model

    t.set_num_threads(1)
    record = json.loads((folder / "nodes.json").read_text())
    model = tl2_model(model_dir)[0]
    model.set_use_split_qkv_input(False)  # one input per head (a node's score: its edges' summed)
    model.set_use_attn_in(True)
    clean, corrupt = t.tensor(record["clean_ids"]), t.tensor(record["corrupted_ids"])
    wall, cpu = time.perf_counter(), time.process_time()
    model = patchable_model(model, factorized=True, slice_output=None, separate_qkv=False, device=t.device("cpu"))
    patch = src_ablations(model, corrupt)
    set_all_masks(model, val=0.0)
    with train_mask_mode(model) as masks, patch_mode(model, patch):
        _metric(model(clean), record, t).mean().backward()
        grads = {k: m.grad.detach().clone() for k, m in masks.items()}
    theirs: dict = {}
    for edge in model.edges:
        name = edge.src.name
        label = f"MLP{name[4:]}" if name.startswith("MLP ") else "L{}H{}".format(*name[1:].split(".")) if name.startswith("A") else None  # fmt: skip
        if label is not None:
            theirs[label] = theirs.get(label, 0.0) + grads[edge.dest.module_name][edge.patch_idx].item()
    timing = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "peak_rss_gb": peak_rss_gb()}
    ours, mine = record["ours"], record["ours_time"]
    common = sorted(set(ours) & set(theirs))
    top = lambda d: sorted(common, key=lambda n: -abs(d[n]))[:10]  # noqa: E731
    print(f"nodes: {len(common)}; largest difference of a node's score {max(abs(ours[n] - theirs[n]) for n in common):.1e} "
          f"nats (the largest score {max(abs(ours[n]) for n in common):.3f})")  # fmt: skip
    print(f"first ten, ours: {', '.join(top(ours))}")
    print(f"first ten, auto-circuit: {', '.join(top(theirs))}")
    print(f"ours: {mine['wall_s']:.1f} s wall, {mine['cpu_s']:.1f} s CPU, peak RSS {mine['peak_rss_gb']:.2f} GB; "
          f"auto-circuit: {timing['wall_s']:.1f} s wall, {timing['cpu_s']:.1f} s CPU, peak RSS "
          f"{timing['peak_rss_gb']:.2f} GB (each process with its model loaded)")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("export", "compare"):
        sys.exit("usage: python -m bench.auto_circuit_nodes export MODEL_DIR DIR | tl2/bin/python "
                 "bench/auto_circuit_nodes.py compare MODEL_DIR DIR")  # fmt: skip
    (export if sys.argv[1] == "export" else compare)(Path(sys.argv[2]), Path(sys.argv[3]))
