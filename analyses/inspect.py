"""Inspect any supported model: where (if anywhere) does the copy-then-BMA mechanism live?

    python -m analyses.inspect                                   # the shipped checkpoint
    python -m analyses.inspect --checkpoint runs/standard        # a Hugging Face folder with task.json
    python -m analyses.inspect --checkpoint w.pt --config cfg.json --key-map map.json

For every head of every layer: the attention from the query position that predicts x_h (target row h
for the disentangled model, flat position L*H + h - 1 for a standard LM) over the candidate parents of
the target (target positions h' < h), renormalised over them, against the BMA posterior (TV, parent
accuracy); its mass on the candidates; its attention to the same position h of each demonstration
(copy behaviour); mean-ablation and clean->corrupted patching of its output (``hook_z``).

Two baselines on the same contexts: BMA, and the uniform-parent mixture (attention spread evenly over
the candidates, BMA with no demonstration: the plateau at initialisation). Verdict rules:
- ``progress = (NLL_uniform - NLL) / (NLL_uniform - NLL_BMA)``; the model is ON THE PLATEAU if
  progress < 0.5 (its NLL is closer to the plateau than to BMA). Then no head is credited. If BMA is
  within 0.005 nats of the plateau on the sampled contexts, no verdict is possible (``on_plateau`` None).
- Otherwise a head is PARENT-SELECTING if its candidate mass >= 0.5, its parent accuracy closes at
  least half the gap from the uniform baseline to BMA, and its TV to BMA is below the uniform's.
- A head is a COPYER of demonstration l if its attention to position h of demonstration l, averaged
  over h, is >= 0.5.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from analyses import common
from probes import bma_posterior, bma_predictive, parent_accuracy, target_nll, total_variation

FIGURES = {
    "inspect_heads.png": (
        "per head of every layer of the inspected model: parent accuracy, TV to the BMA posterior and mass on the candidate parents from the query that predicts x_h, against BMA and the uniform-parent baseline, with the verdict in the title."
    ),
    "inspect_copy.png": (
        "attention from the query predicting x_h to position h of each demonstration, per head (copy behaviour)."
    ),
    "inspect_interventions.png": (
        "NLL change from mean-ablating each head, and the share of the clean-vs-corrupted difference restored by patching it."
    ),
}


PLATEAU_PROGRESS = 0.5  # progress below this: on the plateau
SELECT_FRACTION = 0.5  # a head must close this fraction of the uniform -> BMA parent-accuracy gap
MIN_CANDIDATE_MASS = 0.5
COPY_MASS = 0.5
MIN_PLATEAU_GAP = 0.005  # nats between plateau and BMA below which no verdict is possible
MIN_PATCH_EFFECT = 0.005  # nats between clean and corrupted runs for patching to be defined


@dataclass
class Heads:
    """The subject's hookable heads: ``n_heads[i]`` heads at ``blocks.{i}.attn``."""

    standard: bool  # a Hugging Face LM (ordinary shift) rather than the disentangled model
    n_heads: list[int]

    @classmethod
    def of(cls, model) -> Heads:
        from models import CausalTransformer

        if isinstance(model, CausalTransformer):
            return cls(False, [model.cfg.n_copy_heads, 1])
        return cls(True, [model.cfg.n_heads] * model.cfg.n_layers)

    def labels(self) -> list[str]:
        return [f"L{i}H{j}" for i, n in enumerate(self.n_heads) for j in range(n)]


def log_probs(model, heads: Heads, tokens: Int[Tensor, "batch T"], task, fwd_hooks=()) -> Float[Tensor, "batch H d"]:
    """Target log-probs (row 0 = root) of either model family, with optional forward hooks."""
    from models.standard import prediction_positions

    with model.hooks(fwd_hooks=list(fwd_hooks)):
        if not heads.standard:
            return model(tokens).double()
        logits = model(tokens)[:, prediction_positions(task.n_examples, task.seq_len), : task.d_vocab]
        return logits.double().log_softmax(-1)


def query_rows(model, heads: Heads, tokens: Tensor, task) -> list[Float[Tensor, "batch n_heads H T"]]:
    """Per layer, the attention of each head from the query that predicts x_h to every flat key."""
    from models.standard import prediction_positions

    L, H, T = task.n_examples, task.seq_len, task.n_tokens
    rows: dict[int, Tensor] = {}

    def grab(pattern, hook):
        layer = int(hook.name.split(".")[1])
        if heads.standard:
            rows[layer] = pattern[:, :, prediction_positions(L, H)].double()
        elif layer == 0:  # [batch, K, H, T], queries already at the target rows
            rows[layer] = pattern.double()
        else:  # [batch, 1, H, H] over the target keys only
            full = pattern.new_zeros(*pattern.shape[:3], T).double()
            full[..., L * H :] = pattern
            rows[layer] = full

    names = [f"blocks.{i}.attn.hook_pattern" for i in range(len(heads.n_heads))]
    log_probs(model, heads, tokens, task, [(n, grab) for n in names])
    return [rows[i] for i in range(len(heads.n_heads))]


def head_attention_stats(rows: Tensor, tokens, parents, posterior, task) -> dict:
    """Candidate mass, TV to BMA and parent accuracy of the renormalised candidate attention, and
    copy mass on position h of each demonstration. ``rows`` is one layer's ``[batch, n, H, T]``."""
    L, H = task.n_examples, task.seq_len
    cand = rows[..., L * H :].clone()
    cand = cand.masked_fill(torch.ones(H, H, dtype=torch.bool).triu(), 0)  # keys h' < h only
    mass = cand.sum(-1)  # [batch, n, H]
    renorm = cand / mass.clamp_min(1e-30).unsqueeze(-1)
    n = rows.shape[1]
    same = rows.view(*rows.shape[:3], L + 1, H).diagonal(dim1=2, dim2=4)[:, :, :L]  # [batch, n, L, H]
    return {
        "candidate_mass": [mass[:, j, 1:].mean().item() for j in range(n)],
        "tv": [total_variation(renorm[:, j], posterior)[:, 1:].mean().item() for j in range(n)],
        "parent_acc": [parent_accuracy(renorm[:, j], parents) for j in range(n)],
        "copy_mass": same.mean((0, 3)).tolist(),  # [n, L]: mass on x_h^l from the query predicting x_h
    }


def baselines(task, tokens, parents) -> dict:
    """NLL, TV and parent accuracy of BMA and the uniform-parent mixture on the same contexts."""
    L, H = task.n_examples, task.seq_len
    posterior = bma_posterior(task.pi, tokens, L, H)
    uniform = bma_posterior(task.pi, tokens, L, H, demonstrations=[])  # uniform over h' < h
    return {
        "posterior": posterior,
        "nll_bma": target_nll(bma_predictive(task.pi, tokens, L, H, task.root, log=True), tokens),
        "nll_uniform": target_nll(
            bma_predictive(task.pi, tokens, L, H, task.root, demonstrations=[], log=True), tokens
        ),
        "acc_bma": parent_accuracy(posterior, parents),
        "acc_uniform": parent_accuracy(uniform, parents),
        "tv_uniform": total_variation(uniform, posterior)[:, 1:].mean().item(),
    }


def verdict(nll: float, base: dict, heads: list[dict]) -> dict:
    """Apply the module docstring's rules; ``heads`` hold candidate_mass, tv, parent_acc, copy_mass."""
    gap = base["nll_uniform"] - base["nll_bma"]
    if gap < MIN_PLATEAU_GAP:  # the demonstrations barely help even BMA here: nothing to credit
        progress, on_plateau = None, None
    else:
        progress = (base["nll_uniform"] - nll) / gap
        on_plateau = progress < PLATEAU_PROGRESS
    bar = base["acc_uniform"] + SELECT_FRACTION * (base["acc_bma"] - base["acc_uniform"])
    selecting = [
        h["label"]
        for h in heads
        if on_plateau is False
        and h["candidate_mass"] >= MIN_CANDIDATE_MASS
        and h["parent_acc"] >= bar
        and h["tv"] < base["tv_uniform"]
    ]
    copyers = {
        h["label"]: int(torch.tensor(h["copy_mass"]).argmax()) for h in heads if max(h["copy_mass"]) >= COPY_MASS
    }
    best = max(heads, key=lambda h: h["parent_acc"])["label"]
    return {
        "progress": progress,
        "on_plateau": on_plateau,
        "parent_acc_bar": bar,
        "parent_selecting": selecting,
        "copyers": copyers,
        "best_head": best,
    }


def interventions(model, heads: Heads, task, tokens, corrupted) -> dict:
    """Per head: NLL change under mean ablation of its ``hook_z``, and the fraction of the clean-vs-
    corrupted NLL difference restored by patching its clean ``hook_z`` into the corrupted run."""
    names = [f"blocks.{i}.attn.hook_z" for i in range(len(heads.n_heads))]
    clean_z: dict[str, Tensor] = {}

    def store(z, hook, name):  # hook.name may be an alias's canonical name (TransformerBridge)
        clean_z[name] = z.detach().clone()

    hooks = [(n, lambda z, hook, n=n: store(z, hook, n)) for n in names]
    nll_clean = target_nll(log_probs(model, heads, tokens, task, hooks), tokens)
    nll_corrupt = target_nll(log_probs(model, heads, corrupted, task), corrupted)
    ablation, patching = [], []
    jobs = [(i, j) for i, n in enumerate(heads.n_heads) for j in range(n)]
    for i, j in tqdm(jobs, desc="ablate/patch heads", leave=False, disable=len(jobs) < 8):
        name = names[i]

        def mean_ablate(z, hook, j=j):
            z = z.clone()
            z[:, :, j] = z[:, :, j].mean(0, keepdim=True)
            return z

        def patch(z, hook, j=j, name=name):
            z = z.clone()
            z[:, :, j] = clean_z[name][:, :, j]
            return z

        ablation.append(target_nll(log_probs(model, heads, tokens, task, [(name, mean_ablate)]), tokens) - nll_clean)
        patched = target_nll(log_probs(model, heads, corrupted, task, [(name, patch)]), corrupted)
        # Undefined when the demonstrations make no difference (a model on the plateau): None.
        usable = abs(nll_corrupt - nll_clean) >= MIN_PATCH_EFFECT
        patching.append((nll_corrupt - patched) / (nll_corrupt - nll_clean) if usable else None)
    return {
        "nll_clean": nll_clean,
        "nll_corrupted": nll_corrupt,
        "ablation_dnll": ablation,
        "patching_restored": patching,
    }


def corrupt(task, tokens: Tensor, seed: int) -> Tensor:
    """Same target sequence, demonstrations from a fresh tree (the corrupted run of issue 3)."""
    other, _ = task.sample(len(tokens), torch.Generator().manual_seed(seed + 7919))
    out = other.clone()
    out[:, -task.seq_len :] = tokens[:, -task.seq_len :]
    return out


@torch.no_grad()
def inspect_model(model, task, n_contexts: int = 512, seed: int = 0, batch: int = 256) -> dict:
    """Every number of the report (see the module docstring)."""
    heads = Heads.of(model)
    tokens, parents = common.sample_contexts(task, n_contexts, seed)
    base = baselines(task, tokens, parents)
    lp = torch.cat([log_probs(model, heads, tokens[i : i + batch], task) for i in range(0, n_contexts, batch)])
    nll = target_nll(lp, tokens)
    stats = None
    for i in range(0, n_contexts, batch):
        rows = query_rows(model, heads, tokens[i : i + batch], task)
        part = [
            head_attention_stats(
                r, tokens[i : i + batch], parents[i : i + batch], base["posterior"][i : i + batch], task
            )
            for r in rows
        ]
        w = len(tokens[i : i + batch]) / n_contexts
        part = [{k: torch.tensor(v, dtype=torch.float64) * w for k, v in layer.items()} for layer in part]
        stats = part if stats is None else [{k: a[k] + b[k] for k in a} for a, b in zip(stats, part)]
    labels = heads.labels()
    per_head = []
    for i, layer in enumerate(stats):
        for j in range(heads.n_heads[i]):
            per_head.append({"label": f"L{i}H{j}", **{k: v[j].tolist() for k, v in layer.items()}})
    assert [h["label"] for h in per_head] == labels
    n_int = min(n_contexts, 128)
    inter = interventions(model, heads, task, tokens[:n_int], corrupt(task, tokens[:n_int], seed))
    for h, a, p in zip(per_head, inter["ablation_dnll"], inter["patching_restored"]):
        h.update(ablation_dnll=a, patching_restored=p)
    return {
        "kind": "standard" if heads.standard else "disentangled",
        "nll": nll,
        **{k: v for k, v in base.items() if k != "posterior"},
        "heads": per_head,
        "intervention_contexts": n_int,
        "nll_clean": inter["nll_clean"],
        "nll_corrupted": inter["nll_corrupted"],
        **verdict(nll, base, per_head),
    }


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def report(r: dict, n: int) -> str:
    lines = [
        f"{'':16s}{'NLL':>8s}{'gap':>9s}{'parent acc':>12s}{'TV to BMA':>11s}",
        f"{'model':16s}{r['nll']:8.4f}{r['nll'] - r['nll_bma']:+9.4f}{'':>12s}{'':>11s}",
        f"{'BMA':16s}{r['nll_bma']:8.4f}{0:+9.4f}{r['acc_bma']:12.3f}{0:11.3f}",
        (
            f"{'uniform-parent':16s}{r['nll_uniform']:8.4f}{r['nll_uniform'] - r['nll_bma']:+9.4f}"
            f"{r['acc_uniform']:12.3f}{r['tv_uniform']:11.3f}"
        ),
        "",
        (
            f"{'head':6s}{'cand mass':>10s}{'TV':>7s}{'parent acc':>11s}{'max copy':>9s}{'ablate dNLL':>12s}"
            f"{'patch':>7s}"
        ),
    ]
    for h in r["heads"]:
        lines.append(
            f"{h['label']:6s}{h['candidate_mass']:10.3f}{h['tv']:7.3f}{h['parent_acc']:11.3f}"
            f"{max(h['copy_mass']):9.3f}{h['ablation_dnll']:+12.4f}{_fmt(h['patching_restored']):>7s}"
        )
    lines.append("")
    if r["on_plateau"] is None:
        lines.append(
            f"{r['kind']} model, {n} contexts: BMA is within {MIN_PLATEAU_GAP} nats of the uniform-parent "
            f"plateau on these contexts, so no head can be credited (use more contexts or demonstrations)"
        )
    else:
        lines.append(f"{r['kind']} model, {n} contexts: progress from the plateau to BMA {r['progress']:.3f}")
    if r["on_plateau"] is None:
        pass
    elif r["on_plateau"]:
        lines.append(
            f"ON THE UNIFORM-PARENT PLATEAU: no head credited with parent selection "
            f"(best head {r['best_head']} is not evidence of a mechanism)"
        )
    else:
        lines.append(
            f"parent-selecting heads: {', '.join(r['parent_selecting']) or 'none'} "
            f"(bar: parent acc >= {r['parent_acc_bar']:.3f})"
        )
    lines.append("copyers: " + (", ".join(f"{k}->demo {v}" for k, v in r["copyers"].items()) or "none"))
    return "\n".join(lines)


def plot(r: dict, n: int, out) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    common.style()
    labels = [h["label"] for h in r["heads"]]
    x = np.arange(len(labels))
    verdict_text = (
        "no verdict (BMA ~ plateau)"
        if r["on_plateau"] is None
        else "on the uniform-parent plateau"
        if r["on_plateau"]
        else f"parent-selecting: {', '.join(r['parent_selecting']) or 'none'}"
    )
    fig, axes = plt.subplots(1, 3, figsize=(max(9, 0.5 * len(labels) + 6), 3.4))
    axes[0].bar(x, [h["parent_acc"] for h in r["heads"]], color="C0")
    axes[0].axhline(r["acc_bma"], color="k", label="BMA")
    axes[0].axhline(r["acc_uniform"], color="C3", ls="--", label="uniform-parent")
    axes[0].set(ylabel="parent accuracy", title="argmax = true parent")
    axes[1].bar(x, [h["tv"] for h in r["heads"]], color="C1")
    axes[1].axhline(r["tv_uniform"], color="C3", ls="--", label="uniform-parent")
    axes[1].set(ylabel="TV to BMA posterior", title="candidate attention vs BMA")
    axes[2].bar(x, [h["candidate_mass"] for h in r["heads"]], color="C2")
    axes[2].set(ylabel="attention mass", title="mass on candidate parents", ylim=(0, 1.02))
    for ax in axes:
        ax.set_xticks(x, labels, rotation=90, fontsize=7)
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"{r['kind']} model, {n} contexts: NLL gap to BMA {r['nll'] - r['nll_bma']:+.4f} "
        f"(plateau {r['nll_uniform'] - r['nll_bma']:+.4f}); {verdict_text}",
        fontsize=9,
    )
    common.save_figure(fig, out, "inspect_heads")

    copy = np.array([h["copy_mass"] for h in r["heads"]])
    fig, ax = plt.subplots(figsize=(0.45 * copy.shape[1] + 2.5, 0.3 * len(labels) + 1.5))
    im = ax.imshow(copy, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    ax.grid(False)
    ax.set_yticks(x, labels, fontsize=7)
    ax.set(
        xlabel="demonstration l", title=f"Attention to x_h of demonstration l\nfrom the query predicting x_h ({n} ctx)"
    )
    fig.colorbar(im, ax=ax, label="mass")
    common.save_figure(fig, out, "inspect_copy")

    fig, axes = plt.subplots(1, 2, figsize=(max(8, 0.4 * len(labels) + 4), 3.2))
    axes[0].bar(x, [h["ablation_dnll"] for h in r["heads"]], color="C4")
    axes[0].set(ylabel="NLL change (nats)", title="mean-ablating the head's output")
    axes[1].bar(
        x, [np.nan if h["patching_restored"] is None else h["patching_restored"] for h in r["heads"]], color="C5"
    )
    axes[1].axhline(0, color="k", lw=0.8)
    axes[1].set(ylabel="restored (corrupted 0, clean 1)", title="patching clean output into corrupted run")
    for ax in axes:
        ax.set_xticks(x, labels, rotation=90, fontsize=7)
    fig.suptitle(
        f"Interventions per head, {r['intervention_contexts']} contexts "
        f"(clean NLL {r['nll_clean']:.4f}, corrupted {r['nll_corrupted']:.4f})",
        fontsize=9,
    )
    common.save_figure(fig, out, "inspect_interventions")


def main(argv: list[str] | None = None) -> dict:
    parser = common.analysis_parser("inspect", __doc__.split("\n\n")[0], n_contexts=512)
    args = common.parse_common(parser, argv)
    subject = common.subject_from_args(args)
    r = inspect_model(subject.model, subject.task, args.n_contexts, args.seed)
    print(report(r, args.n_contexts))
    plot(r, args.n_contexts, args.out)
    common.save_json(args.out, "inspect", r, args, subject)
    return r


if __name__ == "__main__":
    common.run(main)
