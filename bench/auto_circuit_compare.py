"""Our exact edge patching and EAP beside auto-circuit 1.0.1's, on the same GPT-2, contexts and edges, timed
side by side in one run. Imported by nothing; two steps, two environments:

    python -m bench.auto_circuit_compare export runs/ac                 # ours (this environment)
    tl2/bin/python bench/auto_circuit_compare.py compare runs/ac   # auto-circuit's (TransformerLens 2.x)

Step 1 (``export``) writes into the folder: the shipped standard GPT-2's weights and config (a Hugging Face
folder: safetensors and config.json), the input ids of the search contexts and of their corrupted
(``demonstrations``) counterparts, the prediction positions and the task's token columns, each of our
edges with its positions, our exact and EAP scores (per edge, mean over the contexts), and the wall and CPU
seconds ``exact_scores`` and ``eap_scores`` took. Step 2 (``compare``) builds TransformerLens 2.x's
``HookedTransformer`` from that folder (docs/results/circuit.md, "Running the peer tools on our GPT-2
subjects"), makes it patchable by auto-circuit (``patchable_model(factorized=True, separate_qkv=True,
seq_len=T)``: one auto-circuit edge per sender, receiver input and position) and, for each of our edges
(a sender into one input of a receiver at a group of positions), sets auto-circuit's patch masks of that
sender and input at those positions to 1 and runs the model once on the contexts, the corrupted run's
activations patched in (auto-circuit's edge patching, as its ACDC does it: ``patch_mode`` and
``start_at_layer`` from the receiver's layer, the edges in ACDC's order, from the last layer's receivers;
auto-circuit has no score of each edge ablated alone, this is the closest it offers). EAP is auto-circuit's
mask gradient (``mask_gradient_prune_scores``'s mechanism: the masks at 0 with gradients, one backward
pass) of our metric, summed over each edge's positions. It prints the largest difference from our scores
and the time ratio, writes auto-circuit's scores into the folder (``auto_circuit.json``, by our edge's
index), and computes ten edges' exact scores a third way (``by_hand``: plain hooks on the Hugging Face
model in float64; the five edges where ours and auto-circuit's differ most and the five largest scores).
auto-circuit's input node is the token and position embeddings together ("Resid Start"); under this
corruption the positions do not change, so it is our ``embed`` sender (our ``pos_embed`` edges score
exactly 0).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

N_CONTEXTS, SEED, CORRUPTION = 128, 0, "demonstrations"


def export(out: Path) -> None:
    """Step 1, in this repository's environment."""
    import shutil

    import torch

    from models import STANDARD_CHECKPOINT, load_subject
    from models.interp.circuit import Runner, build_graph, eap_scores, exact_scores, other_contexts, source_writes

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(STANDARD_CHECKPOINT) / name, out / name)
    subject = load_subject("standard")
    graph = build_graph(subject)
    tokens = subject.task.sample(N_CONTEXTS, torch.Generator().manual_seed(SEED))[0]
    corrupted = other_contexts(subject.task, tokens, CORRUPTION, SEED)
    runner = Runner(subject, graph, tokens, source_writes(subject, graph, tokens, CORRUPTION, SEED))
    timings = {}
    for name, fn in (("exact", exact_scores), ("eap", eap_scores)):
        wall, cpu = time.perf_counter(), time.process_time()
        scores = fn(runner)
        timings[name] = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
        timings[name]["scores"] = [scores.means()[e] for e in graph.edges]
    record = {
        **contexts_record(subject, tokens, corrupted),
        "edges": [edge_record(graph, e) for e in graph.edges],
        "ours": timings,
        "load": __import__("os").getloadavg()[0],
    }
    (out / "compare.json").write_text(json.dumps(record))
    print(f"wrote {out}: {len(graph.edges)} edges, exact {timings['exact']['wall_s']:.1f} s wall "
          f"({timings['exact']['cpu_s']:.1f} s CPU), EAP {timings['eap']['wall_s']:.1f} s wall")  # fmt: skip


def contexts_record(subject, tokens, corrupted) -> dict:
    """What ``by_hand`` and auto-circuit's step read of the contexts: the model's input ids of the clean and
    corrupted contexts, the prediction positions, the targets and the task's token columns (JSON lists)."""
    first = subject.layout.token_offset
    return {
        "clean_ids": subject.layout.encode(tokens).tolist(),
        "corrupted_ids": subject.layout.encode(corrupted).tolist(),
        "prediction_positions": subject.layout.prediction_positions().tolist(),
        "targets": tokens.tolist(),
        "columns": [first, first + subject.task.d_vocab],
    }


def edge_record(graph, edge) -> dict:
    """One of our edges as ``by_hand`` reads it: its sender, receiver, input and group, and its positions."""
    return {**edge.to_dict(), "positions": graph.groups[graph.receiver_of(edge).site][edge.group]}


def _metric(logits, record, t):
    """Per context, our metric (``probes.metrics.per_context_nll``): the mean NLL of the target tokens
    x_1..x_{H-1} at their prediction positions, the log-softmax over the task's token columns (``[batch]``)."""
    pos = t.tensor(record["prediction_positions"])
    lo, hi = record["columns"]
    lp = logits[:, pos, lo:hi].double().log_softmax(-1)
    targets = t.tensor(record["targets"])[:, -len(pos) :]
    return -lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)[:, 1:].mean(-1)


def by_hand(hf, record, edge, t) -> float:
    """A third computation of ``edge``'s exact score, in whatever dtype ``hf`` (the Hugging Face
    ``GPT2LMHeadModel``) is: plain torch hooks on it, no TransformerLens. The sender's write (a head's
    ``z`` through its rows of ``c_proj``, without the bias; an MLP's output; the token embedding) on the
    corrupted contexts minus that on the clean ones, at the edge's positions, is added to the receiver's
    input: a head's ``ln_1`` input, that head's q, k or v columns of ``c_attn`` recomputed from it (the other
    heads and inputs clean); an MLP's ``ln_2`` input; the output's ``ln_f`` input. The mean over contexts of
    the metric's change."""
    blocks, d = hf.transformer.h, hf.config.n_embd
    dh = d // hf.config.n_head

    def run(ids, pre=(), post=()):
        store, handles = {}, []
        handles.append(hf.transformer.wte.register_forward_hook(lambda m, i, o: store.__setitem__("embed", o)))
        for i, b in enumerate(blocks):
            handles.append(b.attn.c_proj.register_forward_hook(lambda m, x, o, i=i: store.__setitem__(i, x[0])))
            handles.append(b.mlp.register_forward_hook(lambda m, x, o, i=i: store.__setitem__(f"MLP{i}", o)))
        handles += [m.register_forward_pre_hook(f) for m, f in pre] + [m.register_forward_hook(f) for m, f in post]
        try:
            with t.no_grad():
                return store, hf(t.tensor(ids)).logits
        finally:
            for h in handles:
                h.remove()

    def write(store, name):
        if name == "embed" or name.startswith("MLP"):
            return store[name]
        i, j = map(int, name[1:].split("H"))
        return store[i][..., j * dh : (j + 1) * dh] @ blocks[i].attn.c_proj.weight[j * dh : (j + 1) * dh]

    clean, logits = run(record["clean_ids"])
    if edge["sender"] == "pos_embed":  # the same on both runs
        return 0.0
    delta = write(run(record["corrupted_ids"])[0], edge["sender"]) - write(clean, edge["sender"])
    mask = t.zeros(delta.shape[1], 1, dtype=delta.dtype)
    mask[edge["positions"]] = 1
    delta = delta * mask
    r, pre, post = edge["receiver"], [], []
    if r == "output":
        pre = [(hf.transformer.ln_f, lambda m, x: (x[0] + delta,))]
    elif r.startswith("MLP"):
        pre = [(blocks[int(r[3:])].ln_2, lambda m, x: (x[0] + delta,))]
    else:
        i, j = map(int, r[1:].split("H"))
        col = "qkv".index(edge["input"]) * d + j * dh
        resid = {}
        pre = [(blocks[i].ln_1, lambda m, x: resid.__setitem__("pre", x[0]))]

        def qkv(m, x, out):  # c_attn (a Conv1D: x @ weight + bias) of ln_1 of the edited input, without hooks
            ln = blocks[i].ln_1
            edited = t.nn.functional.layer_norm(resid["pre"] + delta, (d,), ln.weight, ln.bias, ln.eps)
            out = out.clone()
            out[..., col : col + dh] = edited @ m.weight[:, col : col + dh] + m.bias[col : col + dh]
            return out

        post = [(blocks[i].attn.c_attn, qkv)]
    ablated = run(record["clean_ids"], pre, post)[1]
    return (_metric(ablated, record, t) - _metric(logits, record, t)).mean().item()


def tl2_model(folder: Path):
    """TransformerLens 2.x's ``HookedTransformer`` of the Hugging Face GPT-2 in ``folder`` (no LayerNorm folding,
    no centring: the same function), with split q/k/v inputs, MLP inputs and per-head results hooked, as
    auto-circuit needs them; and the Hugging Face model it was made from."""
    import transformer_lens as tl
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(folder).eval()
    c = hf.config
    cfg = tl.HookedTransformerConfig(n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head,
                                     d_head=c.n_embd // c.n_head, d_mlp=c.n_inner or 4 * c.n_embd,
                                     d_vocab=c.vocab_size, n_ctx=c.n_positions, act_fn="gelu_new",
                                     normalization_type="LN")  # fmt: skip
    model = tl.HookedTransformer(cfg)
    model.load_and_process_state_dict(convert_gpt2_weights(hf, cfg), fold_ln=False, center_writing_weights=False,
                                      center_unembed=False)  # fmt: skip
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    model.set_use_attn_result(True)
    model.eval()
    return model, hf


def compare(folder: Path) -> None:
    """Step 2, with TransformerLens 2.x and auto-circuit 1.0.1 (``tl2/bin/python``)."""
    import torch as t
    from auto_circuit.utils.ablation_activations import src_ablations
    from auto_circuit.utils.graph_utils import patch_mode, patchable_model, set_all_masks, train_mask_mode

    t.set_num_threads(1)
    record = json.loads((folder / "compare.json").read_text())
    model, hf = tl2_model(folder)
    cfg = model.cfg
    clean, corrupt = t.tensor(record["clean_ids"]), t.tensor(record["corrupted_ids"])
    seq = clean.shape[1]
    model = patchable_model(model, factorized=True, slice_output=None, seq_len=seq, separate_qkv=True,
                            device=t.device("cpu"))  # fmt: skip
    src_name = lambda n: "Resid Start" if n == "embed" else (f"MLP {n[3:]}" if n.startswith("MLP") else  # noqa: E731
                                                               "A{}.{}".format(*n[1:].split("H")))  # fmt: skip

    def dest_name(e) -> str:
        r = e["receiver"]
        if r == "output":
            return "Resid End"
        return f"MLP {r[3:]}" if r.startswith("MLP") else "A{}.{}.{}".format(*r[1:].split("H"), e["input"].upper())

    by_key = {}
    for edge in model.edges:
        by_key.setdefault((edge.src.name, edge.dest.name), []).append(edge)
    # Each of our edges (by its index) -> auto-circuit's edges of its sender and input at its positions.
    ac = {i: [a for a in by_key[(src_name(e["sender"]), dest_name(e))] if a.seq_idx in set(e["positions"])]
          for i, e in enumerate(record["edges"]) if e["sender"] != "pos_embed"}  # fmt: skip
    layer = {i: int(edges[0].dest.module_name.split(".")[1]) for i, edges in ac.items()}
    patch = src_ablations(model, corrupt)
    with t.inference_mode():
        clean_values = _metric(model(clean), record, t)

    # Exact: each of our edges ablated alone, one forward pass of the contexts each, from the receiver's
    # layer on (auto-circuit's ACDC: the clean run's sources and residuals recorded once, start_at_layer).
    # In ACDC's order, from the last layer's receivers: a pass overwrites the shared record of the sources'
    # outputs (``curr_src_outs``) of every layer it runs, and a pass that starts at a later layer reads the
    # earlier layers' from it. In our order (layer 0's receivers first) the passes from layer 1 read MLP0's
    # output as the last pass from layer 0 left it (L0H7 -> MLP0 at the target's positions ablated), and
    # MLP0's edges at the target's positions differed from ours and from ``by_hand`` by up to 1.4e-4 nats.
    wall, cpu = time.perf_counter(), time.process_time()
    exact, current = {}, src_ablations(model, clean)
    with t.inference_mode():
        _, toks, short_embd, attn_mask = model.input_to_embed(clean)
        _, cache = model.run_with_cache(clean)
        resids = [cache[f"blocks.{i}.hook_resid_pre"].clone() for i in range(cfg.n_layers)]
        del cache
    with patch_mode(model, patch, curr_src_outs=current):
        for i in sorted(ac, key=lambda i: -layer[i]):
            set_all_masks(model, val=0.0)
            for a in ac[i]:
                a.patch_mask(model).data[a.patch_idx] = 1.0
            start = layer[i]
            with t.inference_mode():
                logits = model(resids[start], start_at_layer=start, tokens=toks, shortformer_pos_embed=short_embd,
                               attention_mask=attn_mask)  # fmt: skip
                exact[i] = (_metric(logits, record, t) - clean_values).mean().item()
    ac_exact = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}

    # EAP: the gradient of the metric with respect to every patch mask at 0, one backward pass.
    wall, cpu = time.perf_counter(), time.process_time()
    set_all_masks(model, val=0.0)
    with train_mask_mode(model) as masks, patch_mode(model, patch):
        _metric(model(clean), record, t).mean().backward()
        grads = {k: m.grad.detach().clone() for k, m in masks.items()}
    eap = {i: sum(grads[a.dest.module_name][a.patch_idx].item() for a in edges) for i, edges in ac.items()}
    ac_eap = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}

    mine = record["ours"]
    (folder / "auto_circuit.json").write_text(json.dumps({"exact": exact, "eap": eap}))
    for name, theirs, timing in (("exact", exact, ac_exact), ("eap", eap, ac_eap)):
        diff = max(abs(theirs[i] - mine[name]["scores"][i]) for i in theirs)
        print(f"{name}: {len(theirs)} edges; largest difference from ours {diff:.1e} nats (the largest score "
              f"{max(abs(v) for v in theirs.values()):.2f} nats); auto-circuit "
              f"{timing['wall_s']:.1f} s wall ({timing['cpu_s']:.1f} s CPU), ours {mine[name]['wall_s']:.1f} s wall "
              f"({mine[name]['cpu_s']:.1f} s CPU): auto-circuit / ours = {timing['cpu_s'] / mine[name]['cpu_s']:.2f} "
              "in CPU time")  # fmt: skip
    # A third computation: by hand, plain hooks on the Hugging Face model in float64, of the edges where ours
    # and auto-circuit's exact scores differ most and of the largest scores.
    hf = hf.double()
    scores = mine["exact"]["scores"]
    check = sorted(exact, key=lambda i: -abs(exact[i] - scores[i]))[:5]
    check += [i for i in sorted(exact, key=lambda i: -abs(scores[i])) if i not in check][:5]
    hand = {i: by_hand(hf, record, record["edges"][i], t) for i in check}
    print(f"by hand (float64) on {len(check)} edges (the 5 that differ most, the 5 largest): ours differs by at "
          f"most {max(abs(scores[i] - hand[i]) for i in check):.1e} nats, auto-circuit by at most "
          f"{max(abs(exact[i] - hand[i]) for i in check):.1e}")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("export", "compare"):
        sys.exit("usage: python -m bench.auto_circuit_compare export DIR | tl2/bin/python "
                 "bench/auto_circuit_compare.py compare DIR")  # fmt: skip
    (export if sys.argv[1] == "export" else compare)(Path(sys.argv[2]))
