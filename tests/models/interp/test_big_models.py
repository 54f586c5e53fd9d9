"""Models larger than the shipped ones (issue 44), on a scaled-down stand-in: a Hugging Face GPT-2 of 4 layers,
8 heads and a 1,000-token vocabulary (random weights, ``save_pretrained``, the shipped standard model's task
with its tokens at ids 700..704 after a BOS). The task's logits are read from the unembedding's columns for
its ids alone; per-head ablation, patching and the inputs of the last layer run stacked along the batch, or
beyond the work bound by attribution patching with the first-ranked heads re-measured exactly. Each number is
checked against Hugging Face's own forward pass with hand-written hooks (full vocabulary, one head at a time),
or against the derivative taken by finite differences in float64."""

from __future__ import annotations

import copy
import json

import matplotlib.pyplot as plt
import pytest
import torch
from test_formats_pipelines import save_random_gpt2

from analyses import common, inspect
from models import STANDARD_CHECKPOINT, load_subject
from models.interp import inspection
from models.interp.circuit import Runner, build_graph, sender_writes
from models.interp.interventions import Intervention, run_copies
from models.interp.memory import forward_bytes
from models.interp.subject import head_label
from models.nets.edelman import EdelmanConfig, EdelmanTransformer
from models.nets.hooked_transformer import HookedTransformer
from models.plumbing import progress
from probes import MarkovTreeTask
from probes.layout import Layout
from probes.metrics import per_context_nll

LAYOUT = {"order": "example-major", "bos": 3, "token_offset": 700}
SHAPE = dict(n_layer=4, n_head=8, n_embd=64, vocab_size=1000, n_positions=64)


def standard_task() -> MarkovTreeTask:
    raw = json.loads((STANDARD_CHECKPOINT / "task.json").read_text())
    return MarkovTreeTask.from_dict({k: v for k, v in raw.items() if k not in ("kind", "layout")})


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """(folder, the Hugging Face model, task, layout) of the stand-in: weights N(0, 0.3) but the LayerNorms'
    (with N(0, 0.4) the outputs saturate; with N(0, 0.1) the demonstrations move the NLL by 6e-5 nats, too
    little for patching to be defined; here by 0.006)."""
    folder = tmp_path_factory.mktemp("stand_in") / "gpt2"
    task = standard_task()
    hf = save_random_gpt2(folder, task, LAYOUT, **SHAPE)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "ln" not in name:
                p.mul_(0.75)
    hf.save_pretrained(folder)
    return folder, hf.eval(), task, Layout(task.n_examples, task.seq_len, task.d_vocab, bos=3, token_offset=700)


def hf_log_probs(hf, layout: Layout, tokens, edits=None) -> torch.Tensor:
    """Hugging Face's forward pass over the full vocabulary (in the model's precision), then the task's ids:
    log-probs [batch, H, d], float64. ``edits``: {layer: f(z) -> z} on the heads' outputs merged, the input of ``attn.c_proj``."""
    handles = [hf.transformer.h[i].attn.c_proj.register_forward_pre_hook(lambda m, args, f=f: (f(args[0]),))
               for i, f in (edits or {}).items()]  # fmt: skip
    try:
        with torch.no_grad():
            logits = hf(layout.encode(tokens), use_cache=False).logits.double()
    finally:
        for h in handles:
            h.remove()
    first = layout.token_offset
    return logits[:, layout.prediction_positions(), first : first + layout.d_vocab].log_softmax(-1)


def merged_z(hf, layout, tokens) -> dict[int, torch.Tensor]:
    """Every layer's heads' outputs, merged ``[batch, pos, head * d_head]``, recorded at ``attn.c_proj``."""
    store = {}

    def keep(i):
        def f(z):
            store[i] = z.clone()
            return z

        return f

    hf_log_probs(hf, layout, tokens, {i: keep(i) for i in range(SHAPE["n_layer"])})
    return store


def with_head(z: torch.Tensor, head: int, value: torch.Tensor) -> torch.Tensor:
    e = SHAPE["n_embd"] // SHAPE["n_head"]
    z = z.clone()
    z[..., head * e : (head + 1) * e] = value[..., head * e : (head + 1) * e]
    return z


def test_the_task_logits_equal_the_full_vocabulary_computation(stand_in, tmp_path):
    folder, hf, task, layout = stand_in
    tokens, _ = task.sample(32, torch.Generator().manual_seed(1))
    bridge = load_subject(folder)  # a TransformerBridge: run to lm_head's input, lm_head's rows 700..704
    assert type(bridge.model).__name__ == "TransformerBridge"
    with torch.no_grad():  # its full logits, then the task's (what the suite computed before)
        full = bridge.model(layout.encode(tokens))[:, layout.prediction_positions(), 700:705].double().log_softmax(-1)
    assert (bridge.log_probs(tokens) - full).abs().max() < 1e-6
    assert (bridge.log_probs(tokens) - hf_log_probs(hf, layout, tokens)).abs().max() < 1e-5  # the bridge is HF's model
    # Our HookedTransformer (nanoGPT and TransformerLens checkpoints load into it; a GPT-2 with
    # scale_attn_weights=false too): its W_U's columns 700..704 at the positions read
    unscaled = save_random_gpt2(tmp_path / "unscaled", task, LAYOUT, **SHAPE, scale_attn_weights=False)
    ours = load_subject(tmp_path / "unscaled")
    assert isinstance(ours.model, HookedTransformer)
    with torch.no_grad():  # its full logits, then the task's (what the suite computed before)
        full = ours.model(layout.encode(tokens))[:, layout.prediction_positions(), 700:705].double().log_softmax(-1)
    assert (ours.log_probs(tokens) - full).abs().max() < 1e-6
    assert (ours.log_probs(tokens) - hf_log_probs(unscaled.double(), layout, tokens)).abs().max() < 1e-4
    # Edelman et al.'s model: its lm_head's rows, against its own full forward pass
    torch.manual_seed(0)
    net = EdelmanTransformer(EdelmanConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=1000, block_size=64)).eval()
    ids = layout.encode(tokens)
    pos = layout.prediction_positions()
    with torch.no_grad():
        full = net(ids)[:, pos, 700:705]
        assert (net.logits_at(ids, pos, slice(700, 705)) - full).abs().max() < 1e-6


def test_the_memory_a_context_takes_does_not_grow_with_the_vocabulary(tmp_path, stand_in):
    """The per-context figure that sizes --n-contexts: the same model with 20 times the vocabulary takes the
    same memory a context (before: the logits over the whole vocabulary, 43 x 20,000 floats a context)."""
    task = standard_task()
    sizes = {}
    for vocab in (1000, 20000):
        save_random_gpt2(tmp_path / str(vocab), task, LAYOUT, **{**SHAPE, "vocab_size": vocab})
        subject = load_subject(tmp_path / str(vocab))
        one, two = (forward_bytes(subject.log_probs, subject.task, n) for n in (1, 2))
        sizes[vocab] = two - one
    assert sizes[1000] == sizes[20000]


def test_stacked_runs_equal_one_run_each_also_when_split(stand_in):
    folder, hf, task, layout = stand_in
    subject = load_subject(folder)
    tokens, _ = task.sample(10, torch.Generator().manual_seed(2))
    z = merged_z(hf, layout, tokens)[2].float().view(10, -1, 8, 8)
    copies = [[Intervention("blocks.2.attn.hook_z", "patch", heads=(h,), value=z.flip(0))] for h in range(3)]
    copies.append([Intervention("blocks.1.attn.hook_z", "mean", heads=(5,), value=z.mean(0, keepdim=True))])
    one_each = torch.stack([subject.log_probs(tokens, [iv.fwd_hook() for iv in c]) for c in copies])
    for rows in (40, 20, 3):  # every copy in one pass; two copies a pass; three contexts a pass
        assert (run_copies(subject, tokens, copies, rows) - one_each).abs().max() < 1e-9


class Stages:
    """``models.plumbing.progress.progress`` as inspection calls it, keeping each stage's name, total and the
    work it reported done."""

    seen: list = []

    def __init__(self, iterable=None, desc="", total=None, **kw):
        self.bar, self.desc, self.total, self.n = progress.progress(iterable, desc, total, **kw), desc, total, 0

    def update(self, n=1):
        self.n += n
        self.bar.update(n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.bar.close()
        Stages.seen.append((self.desc.removeprefix("inspect: "), self.total, self.n))


def run_inspect(folder, out, monkeypatch, bound=None) -> dict:
    if bound is not None:
        monkeypatch.setattr(inspection, "WORK_BOUND", bound)
    monkeypatch.setattr(inspection, "progress_bar", Stages)
    Stages.seen = []
    return inspect.main(["--checkpoint", str(folder), "--n-contexts", "64", "--out", str(out)]).data


def exact_heads(hf, layout, tokens, bad, only=None):
    """Per head (of ``only``; None: every one), with Hugging Face's forward pass and one head at a time: each
    context's NLL change under mean ablation (the mean over ``tokens``) and the patched corrupted run's NLL,
    ``{label: (cost, patched)}``."""
    nll = lambda lp, t: per_context_nll(lp, t)  # noqa: E731
    clean, z_clean = nll(hf_log_probs(hf, layout, tokens), tokens), merged_z(hf, layout, tokens)
    out = {}
    for i in range(SHAPE["n_layer"]):
        mean = z_clean[i].mean(0, keepdim=True)
        for j in range(SHAPE["n_head"]):
            if only is not None and head_label(i, j) not in only:
                continue
            ablated = hf_log_probs(hf, layout, tokens, {i: lambda z, j=j, m=mean: with_head(z, j, m.expand_as(z))})
            patched = hf_log_probs(hf, layout, bad, {i: lambda z, j=j, c=z_clean[i]: with_head(z, j, c)})
            out[head_label(i, j)] = (nll(ablated, tokens) - clean, nll(patched, bad))
    return out


def test_inspect_on_the_stand_in_equals_one_head_at_a_time_over_the_full_vocabulary(stand_in, tmp_path, monkeypatch):
    """Random weights make no use of the demonstrations: corrupting them moves the NLL by less than 2 SE, and
    inspect refuses every patching share. The rule is lifted here (``beyond_2se``), so that the patched runs'
    numbers are computed and compared."""
    folder, hf, task, layout = stand_in
    monkeypatch.setattr(inspection, "beyond_2se", lambda mean, se: True)
    r = run_inspect(folder, tmp_path / "out", monkeypatch)
    assert "estimated" not in r  # within the bound: every head exactly
    tokens, _ = task.sample(64, torch.Generator().manual_seed(0))
    bad = inspection.corrupt(task, tokens, 0)
    assert abs(r["nll"] - per_context_nll(hf_log_probs(hf, layout, tokens), tokens).mean().item()) < 1e-6
    want = exact_heads(hf, layout, tokens, bad)
    nll_bad = per_context_nll(hf_log_probs(hf, layout, bad), bad).mean().item()
    assert abs(r["nll_corrupted"] - nll_bad) < 1e-6 and abs(nll_bad - r["nll_clean"]) > 0.005  # beyond min_patch_effect
    for h in r["heads"]:
        cost, patched = want[h["label"]]
        assert abs(h["ablation_dnll"] - cost.mean().item()) < 1e-6
        assert abs(h["ablation_se"] - (cost.std() / 8).item()) < 1e-6
        restored = (nll_bad - patched.mean().item()) / (nll_bad - r["nll_clean"])
        assert abs(h["patching_restored"] - restored) < 1e-4
    # The last layer's inputs against the circuit's exact edge patching (every edge into the input ablated)
    subject = load_subject(folder)
    graph = build_graph(subject)
    runner = Runner(subject, graph, tokens, sender_writes(subject, graph, bad)[0])
    for j in (0, SHAPE["n_head"] - 1):  # two heads' inputs: each is two passes of the Runner
        label = head_label(SHAPE["n_layer"] - 1, j)
        for x in "qkv":
            edges = [e for e in graph.edges if (e.receiver, e.input) == (label, x)]
            cost = (runner.run_values(edges) - runner.clean_values).mean().item()
            assert abs(r["inputs"][label][x]["cost"] - cost) < 1e-6
    # Every stage reported its progress, and its total was the work it did (so its estimate of the time left held)
    assert [(stage, done) for stage, total, done in Stages.seen if total == done] == [
        ("log-probs and attention", 64), ("the clean and corrupted runs", 128), ("per-head ablation and patching", 4096),
        ("the inputs of the last layer's heads", 24 * 64), ("sufficiency", 2)]  # fmt: skip


def test_beyond_the_work_bound_heads_are_estimated_by_attribution_and_the_first_ranked_measured(stand_in, monkeypatch):
    """The library call (the command line's path is the test above; its figures, hatched where estimated, are
    drawn here without being saved)."""
    folder, hf, task, layout = stand_in
    subject = load_subject(folder)
    n, f = 64, inspection.flops_per_context(subject)
    spent = 2 * inspection.GRAD_PASS * n * f  # the two passes with gradients
    monkeypatch.setattr(inspection, "progress_bar", Stages)
    Stages.seen = []
    r = inspection.inspect_subject(subject, n, 0, bound=spent + 3.5 * 2 * n * f)  # room for 3 heads
    est = r["estimated"]
    result = common.Result(inspect.ANALYSIS, inspect.Config(n_contexts=n), {**r, "circuit_link": None}, subject.name)
    assert "29 heads are first-order estimates" in result.summary()
    figures = result.figures()
    hatched = [b.get_hatch() for b in figures["inspect_interventions"].axes[0].patches]
    assert [h == "////" for h in hatched] == [h["label"] in est["heads"] for h in r["heads"]]
    plt.close("all")
    assert [(stage, done) for stage, total, done in Stages.seen if total == done] == [
        ("log-probs and attention", 64), ("the clean and corrupted runs, with gradients", 128),
        ("per-head ablation and patching, the first-ranked heads exactly", 3 * 2 * 64),
        ("the inputs of the last layer's heads", 0), ("sufficiency", 2)]  # fmt: skip  (no carrier: no input exactly)
    assert r["carriers"] == [] and all(h.get("estimated") for h in r["heads"] if h["label"] in est["heads"])
    assert len(est["exactly"]) == 3 and len(est["heads"]) == 29 and est["bound_flops"] < est["exact_flops"]
    assert all(h["estimated"] for h in r["inputs"].values())
    tokens, _ = task.sample(64, torch.Generator().manual_seed(0))
    bad = inspection.corrupt(task, tokens, 0)
    by_label = {h["label"]: h for h in r["heads"]}
    want = exact_heads(hf, layout, tokens, bad, only=est["exactly"])
    for label in est["exactly"]:
        assert abs(by_label[label]["ablation_dnll"] - want[label][0].mean().item()) < 1e-6
    # The estimates: d/de of the NLL at z + e (mean - z), by central differences in float64 (Hugging Face's pass)
    hf = copy.deepcopy(hf).double()
    z_clean = merged_z(hf, layout, tokens)
    clean = per_context_nll(hf_log_probs(hf, layout, tokens), tokens)
    checked = 0
    for label in est["heads"][::7]:
        i, j = int(label[1]), int(label.split("H")[1])
        mean = z_clean[i].mean(0, keepdim=True).expand_as(z_clean[i])
        eps = 1e-4
        ends = [per_context_nll(hf_log_probs(hf, layout, tokens, {
            i: lambda z, s=s: with_head(z, j, z + s * eps * (mean - z))}), tokens) for s in (1, -1)]  # fmt: skip
        slope = ((ends[0] - ends[1]) / (2 * eps)).mean().item()
        assert abs(by_label[label]["ablation_dnll"] - slope) < 1e-5 + 1e-3 * abs(slope), label
        assert (ends[0] - clean).abs().max() < 1  # the difference is of the run, not of a broken hook
        checked += 1
    assert checked >= 4


def test_beyond_the_bound_the_named_heads_inputs_are_exact_and_the_others_estimated(stand_in):
    """input_costs with a bound that holds the three inputs of one head: that head's (a carrier the verdict
    names) exactly, equal to the exact costs of every head's; the others' by attribution, each against the
    derivative of Hugging Face's NLL along v + e (v_corrupted - v), by central differences in float64."""
    folder, hf, task, layout = stand_in
    subject = load_subject(folder)
    tokens, _ = task.sample(32, torch.Generator().manual_seed(3))
    bad = inspection.corrupt(task, tokens, 3)
    receivers = inspection.last_layer_receivers(subject)
    names = sorted({r.capture for r in receivers})
    runs = inspection.record_runs(subject, tokens, bad, names, grads=True)
    f = inspection.flops_per_context(subject)
    exact = inspection.input_costs(subject, runs, bound=float("inf"))
    mixed = inspection.input_costs(subject, runs, bound=3.5 * 32 * f, named=["L3H5"])
    assert "estimated" not in mixed["L3H5"] and all(mixed[h].get("estimated") for h in mixed if h != "L3H5")
    assert all(abs(mixed["L3H5"][x]["cost"] - exact["L3H5"][x]["cost"]) < 1e-9 for x in "qkv")
    # The estimate of L3H2's value input: d/de NLL at v + e (v_corrupted - v), v = c_attn's value columns of head 2
    hf = copy.deepcopy(hf).double()
    C, e = SHAPE["n_embd"], SHAPE["n_embd"] // SHAPE["n_head"]
    cols = slice(2 * C + 2 * e, 2 * C + 3 * e)
    attn = hf.transformer.h[SHAPE["n_layer"] - 1].attn.c_attn
    store = {}
    handle = attn.register_forward_hook(lambda m, args, out: store.update(v=out[..., cols].clone()))
    hf_log_probs(hf, layout, bad)
    handle.remove()

    def nll_at(eps):
        def move(m, args, out):
            out = out.clone()
            out[..., cols] += eps * (store["v"] - out[..., cols])
            return out

        handle = attn.register_forward_hook(move)
        try:
            return per_context_nll(hf_log_probs(hf, layout, tokens), tokens)
        finally:
            handle.remove()

    slope = ((nll_at(1e-4) - nll_at(-1e-4)) / 2e-4).mean().item()
    assert abs(mixed["L3H2"]["v"]["cost"] - slope) < 1e-6 + 1e-3 * abs(slope)
    assert abs(slope) > 1e-5  # a derivative that is there to be matched
