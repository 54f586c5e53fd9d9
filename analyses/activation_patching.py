"""Activation patching: where does the clean parent information enter the layer-2 head?

    python -m analyses.activation_patching                              # the shipped checkpoint
    python -m analyses.activation_patching --checkpoint theorem1:beta=50

Clean and corrupted contexts share the whole target sequence (so the clean next token x_h is the same
in both), but the corrupted demonstrations are drawn from a different tree G'. Clean activations are
patched into the corrupted run:
- per copyer head and target position: ``blocks.0.attn.hook_z[:, p, k]`` (the copy u_p^k);
- per residual subspace and position: ``blocks.0.hook_resid_post[:, p, s*d:(s+1)*d]`` (s = 0 the token,
  s = k+1 the copy of head k: the same numbers as the head patch, so the rows must agree);
- per subspace and position, separately on the layer-2 QUERY side (``blocks.1.attn.hook_q``) and KEY
  side (``blocks.1.attn.hook_k``): the two read the same residual, so patching one side moves the
  scores of row p only (query) or of column p only (key);
- each of the above at all positions at once, all copyer heads at once, and the whole query and key
  inputs (alone and together).

Metrics (per context, averaged over target positions h >= 2): log-prob of the clean next token x_h,
and the layer-2 attention mass on the clean true parent pa_G(h). Positions h = 0 and h = 1 are excluded:
there clean and corrupted are equal by construction (no candidate / one candidate). Normalised as a
ratio of mean differences, ``(mean patched - mean corrupted) / (mean clean - mean corrupted)``, over all
contexts and positions h >= 2 (not a mean of per-context ratios, whose denominators can be ~0); so
corrupted = 0, clean = 1, and the position cells of one row add up to roughly the all-positions cell.
The share of (context, h >= 2) pairs whose clean and corrupted values coincide (|diff| < 1e-6) is reported.

Where ``transformer_lens.patching`` fits, and where it does not:
- Every sweep runs through ``generic_activation_patch`` with an explicit ``index_df``: the two layers
  have different head counts (K copyers, one layer-2 head), so the index cannot be inferred from
  ``cfg.n_heads`` and the ``get_act_patch_*`` helpers (which sweep every layer with ``cfg.n_heads``
  heads) do not apply. Head patches use TL's own ``layer_pos_head_vector_patch_setter`` and
  ``layer_head_vector_patch_setter`` (our ``hook_z`` is ``[batch, pos, head, d_head]`` as in TL).
- Residual SUBSPACE patching has no TL setter (TL patches whole residual vectors): ``models.interp.patching``'s.
- A metric only sees the model's output, but the attention-mass metric needs the layer-2 pattern: it is
  captured by a hook attached with ``model.hooks(...)`` around the sweep (an outer hook context that
  the per-cell ``run_with_hooks`` leaves in place and that is removed when the sweep ends, also on error).
- ``generic_activation_patch`` stores metric values in float32 (the default dtype), whatever the model's
  dtype: per-context values are kept (``reduce="none"``) and the normalisation is done in float64.
- Patching the query AND key inputs together needs hooks at two hook points in one forward pass, which
  ``generic_activation_patch`` (one activation name per cell) cannot do: that one cell uses
  ``model.run_with_hooks`` directly.
"""

from __future__ import annotations

from analyses import common
from models.plumbing.io import UsageError

NAME = "activation_patching"
REQUIRES = frozenset({common.DISENTANGLED, common.MARKOV_TASK})  # what it needs of its subject


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    n_contexts: int = common.n_contexts(512)


common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.patching import layer_head_vector_patch_setter, layer_pos_head_vector_patch_setter
from transformer_lens.utilities import get_act_name

from models.interp.interventions import Intervention, corrupted_contexts, description, hooks, log_intervention
from models.interp.patching import generic_activation_patch, index_df, subspace_patch_setter
from models.interp.subject import DisentangledSubject, head_label
from probes import head_assignment

PATTERN = "blocks.1.attn.hook_pattern"  # [batch, 1, H, H]
CLEAN = "clean run, patched into the run on another tree's demonstrations"
METRICS = ("logprob", "parent_mass")
METRIC_LABELS = {"logprob": "log-prob of the clean next token", "parent_mass": "attention on the clean parent"}
FIRST_POSITION = 2  # h = 0, 1: clean and corrupted agree by construction
EQUAL_TOL = 1e-6
FIGURES = {
    f"{NAME}_heads.png": "clean copyer-head outputs patched into runs whose demonstrations come from another tree: "
    "on top, the best single head, the sum of the single heads and all heads at once; below, per head x target "
    "position and at all positions: recovery of the clean token's log-prob and of the attention on the clean "
    "parent (corrupted = 0, clean = 1)",
    f"{NAME}_subspaces.png": "the same per residual subspace of blocks.0.hook_resid_post (token, then one copy "
    "per head); on top, the token subspace (shared, restores nothing) against the best single and the summed copies",
    f"{NAME}_qk.png": "the same on the layer-2 query side vs key side by subspace; on top, the whole input patched "
    "on the query side alone, the key side alone and both: either side alone restores almost none of the "
    "attention on the clean parent, both together restore all of it",
}


def position_metrics(tokens: Int[Tensor, "batch T"], parents: Int[Tensor, "batch H"], capture: dict) -> dict:
    """Per-position metrics ``[batch, H-2]`` (h >= 2) of a run: the log-prob of the clean token x_h
    (from the output) and the attention on the clean parent pa(h) (from the captured layer-2 pattern)."""
    H = parents.shape[1]
    target = tokens[:, -H:, None]
    parent = parents.clamp_min(0)[:, None, :, None]  # [batch, 1, H, 1]; row 0 (parent -1) is dropped below

    def logprob(log_probs: Float[Tensor, "batch H d"]) -> Tensor:
        return log_probs.gather(-1, target.to(log_probs.device))[:, FIRST_POSITION:, 0].double()

    def parent_mass(_log_probs) -> Tensor:
        pattern = capture["pattern"]
        return pattern.gather(-1, parent.to(pattern.device))[:, 0, FIRST_POSITION:, 0].double()

    return {"logprob": logprob, "parent_mass": parent_mass}


def _capture(store: dict):
    """A hook that keeps the latest layer-2 pattern in ``store``."""

    def hook(pattern, hook=None):
        store["pattern"] = pattern

    return hook


def patch_everything(corrupted, index, clean):
    """Setter: the whole clean activation."""
    return clean


def patch_nothing(corrupted, index, clean):
    """Setter: leave the corrupted activation as it is."""
    return corrupted


class Patcher:
    """Clean cache, corrupted tokens and the clean / corrupted baselines of one set of contexts."""

    def __init__(
        self,
        model,
        clean_tokens: Int[Tensor, "batch T"],
        corrupted_tokens: Int[Tensor, "batch T"],
        clean_parents: Int[Tensor, "batch H"],
    ):
        if model.training:
            raise ValueError("activation patching needs model.eval(); the model is in training mode")
        self.model, self.corrupted_tokens = model, corrupted_tokens
        self.store, self.log = {}, []  # log: every intervention run, for the JSON
        per_position = position_metrics(clean_tokens, clean_parents, self.store)
        # generic_activation_patch takes one value per context: the mean over positions h >= 2.
        self.metrics = {name: (lambda out, f=f: f(out).mean(1)) for name, f in per_position.items()}
        with torch.no_grad(), self.capturing():
            clean_out, self.clean_cache = model.run_with_cache(clean_tokens)
            clean = torch.stack([f(clean_out) for f in per_position.values()])  # [metric, batch, H-2]
            corrupted_out = model(corrupted_tokens)
            corrupted = torch.stack([f(corrupted_out) for f in per_position.values()])
        # Rounded to float32 as generic_activation_patch stores patched values, so equal runs compare equal.
        self.clean, self.corrupted = (x.mean(-1).float().double() for x in (clean, corrupted))  # [metric, batch]
        self.denominator = self.clean.mean(-1) - self.corrupted.mean(-1)
        self.equal_share = ((clean - corrupted).abs() < EQUAL_TOL).double().mean((1, 2))
        for name, den in zip(self.metrics, self.denominator.tolist()):
            if abs(den) < 1e-9:
                raise UsageError(
                    f"clean and corrupted runs give the same mean {name} ({den:.2g} apart); "
                    "expected corrupted demonstrations that change the model's output"
                )

    def capturing(self):
        """Context in which every forward pass stores its layer-2 pattern (for the attention metric)."""
        return self.model.hooks(fwd_hooks=[(PATTERN, _capture(self.store))])

    def normalise(self, values: Float[Tensor, "metric cells batch"]) -> Float[Tensor, "metric cells"]:
        """Ratio of mean differences: (mean patched - mean corrupted) / (mean clean - mean corrupted)."""
        return (values.double().mean(-1) - self.corrupted.mean(-1)[:, None]) / self.denominator[:, None]

    def sweep(
        self, activation: str, setter, cells: pd.DataFrame, tokens: Tensor | None = None
    ) -> Float[Tensor, "metric cells"]:
        """Normalised effect of each patch in ``cells`` (an index_df), run on the corrupted tokens
        (or on ``tokens``), through ``models.interp.patching.generic_activation_patch`` (TransformerLens's, checked)."""
        tokens = self.corrupted_tokens if tokens is None else tokens
        log_intervention(self.log, {**description(get_act_name(activation, int(cells["layer"].iloc[0])), "patch", CLEAN),
                          "one_forward_pass_per": [c for c in cells.columns if c != "layer"] or "sweep",
                          "setter": setter.__name__})  # fmt: skip
        with self.capturing():
            result = generic_activation_patch(
                self.model, tokens, self.clean_cache, self.metrics, setter, activation, index_df=cells, reduce="none"
            )
        return self.normalise(result.values)

    @torch.no_grad()
    def patch_together(self, activations: list[str]) -> Float[Tensor, " metric"]:
        """Normalised effect of patching several whole activations in one forward pass."""
        whole = [Intervention(name, "patch", value=self.clean_cache[name], source=CLEAN) for name in activations]
        with self.capturing():
            out = self.model.run_with_hooks(self.corrupted_tokens, fwd_hooks=hooks(whole, self.log))
            values = torch.stack([f(out) for f in self.metrics.values()])
        return self.normalise(values.float()[:, None])[:, 0]


def activation_patching(
    subject: DisentangledSubject,
    tokens: Int[Tensor, "batch T"],
    parents: Int[Tensor, "batch H"],
    generator: torch.Generator,
) -> dict:
    """Every patch of the module docstring; values are ``[metric, ...]`` normalised effects, metrics
    in the order of ``METRICS``. Corrupted demonstrations are drawn with ``generator``."""
    model, task = subject.model, subject.task
    cfg = model.cfg
    K, H, d = cfg.n_copy_heads, cfg.seq_len, cfg.d_vocab
    corrupted, corrupted_parents = corrupted_contexts(task, tokens, generator)
    p = Patcher(model, tokens, corrupted.to(tokens.device), parents)
    sub = subspace_patch_setter(d)
    one = pd.DataFrame({"layer": [0]})
    r = {
        "heads_by_position": p.sweep(
            "z", layer_pos_head_vector_patch_setter, index_df(0, ("pos", H), ("head_index", K))
        )
        .view(2, H, K)
        .transpose(1, 2),
        "heads_all_positions": p.sweep("z", layer_head_vector_patch_setter, index_df(0, ("head_index", K))),
        "all_heads": p.sweep("z", patch_everything, one)[:, 0],
        "nothing": p.sweep("z", patch_nothing, one)[:, 0],
        "subspaces_by_position": p.sweep("resid_post", sub, index_df(0, ("pos", H), ("subspace", K + 1)))
        .view(2, H, K + 1)
        .transpose(1, 2),
        "subspaces_all_positions": p.sweep("resid_post", sub, index_df(0, ("subspace", K + 1))),
    }
    for side, act in (("query", "q"), ("key", "k")):
        r[f"{side}_by_position"] = (
            p.sweep(act, sub, index_df(1, ("pos", H), ("subspace", K + 1))).view(2, H, K + 1).transpose(1, 2)
        )
        r[f"{side}_all_positions"] = p.sweep(act, sub, index_df(1, ("subspace", K + 1)))
        r[f"{side}_all"] = p.sweep(act, patch_everything, pd.DataFrame({"layer": [1]}))[:, 0]
    r["query_and_key_all"] = p.patch_together(["blocks.1.attn.hook_q", "blocks.1.attn.hook_k"])
    demos, _ = head_assignment(model.copyer_pattern().detach().cpu(), cfg.n_examples)
    r.update(
        demonstrations=demos,
        metrics=list(METRICS),
        clean_mean=p.clean.mean(-1),
        corrupted_mean=p.corrupted.mean(-1),
        equal_share=p.equal_share,
        same_parent_share=(parents == corrupted_parents)[:, FIRST_POSITION:].double().mean().item(),
        excluded_positions=list(range(FIRST_POSITION)),
        interventions=p.log,
    )
    return r


def subspace_labels(K: int) -> list[str]:
    """Residual subspaces: the token, then the copy of each copyer head."""
    return ["token"] + [f"{head_label(0, k)} copy" for k in range(K)]


def _heatmap(ax, values: np.ndarray, rows: list[str], cols: list, title: str, limit: float, annotate: bool = False):
    """A diverging heatmap centred at 0 on the figure's one scale (+-``limit``, shared by every heatmap of
    the figure, so that a small effect looks small beside a large one); returns the image for the colour bar."""
    im = ax.imshow(values, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
    ax.set(yticks=range(len(rows)), yticklabels=rows, xticks=range(len(cols)), xticklabels=cols)
    ax.set_title(title, fontsize=10)
    ax.tick_params(labelsize=9)
    ax.grid(False)
    if annotate:
        for (i, j), v in np.ndenumerate(values):
            ax.text(j, i, f"{round(v, 3) + 0.0:.3f}", ha="center", va="center", fontsize=8,
                    color="w" if abs(v) > 0.6 * limit else "k")  # fmt: skip
    return im


def _shared_limit(*arrays) -> float:
    """The one colour limit of a kind of heatmap (at one position, or at all): their largest |value|."""
    return max(max(float(np.abs(np.asarray(a)).max()) for a in arrays), 1e-12)


def _colour_bars(fig, by_position: tuple, all_positions: tuple) -> None:
    """Two colour bars, each (image, axes) shared by every heatmap of its kind: at one position (below) and
    at all positions (right)."""
    fig.colorbar(by_position[0], ax=by_position[1], location="bottom", fraction=0.04, pad=0.01, aspect=60,
                 label="share restored by a patch at one position p (one scale for these heatmaps)")  # fmt: skip
    fig.colorbar(all_positions[0], ax=all_positions[1], fraction=0.25, pad=0.04, aspect=40,
                 label="share restored at all positions (one scale)")  # fmt: skip


def _headline(ax, bars: dict[str, Tensor], title: str):
    """The claim's case: one group of bars per patch (``bars``: label -> [metric] share restored), one
    colour per metric, values printed, corrupted (0) and clean (1) marked."""
    x = np.arange(len(bars))
    width = 0.8 / len(METRICS)
    for i, metric in enumerate(METRICS):
        vals = [float(v[i]) for v in bars.values()]
        b = ax.bar(x + (i - (len(METRICS) - 1) / 2) * width, vals, width, color=f"C{i}", label=METRIC_LABELS[metric])
        ax.bar_label(b, fmt="%.3f", fontsize=9)
    ax.axhline(1, color="k", ls="--", lw=1, label="clean run (1)")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x, list(bars), fontsize=10)
    ax.set_ylim(min(0.0, min(float(v.min()) for v in bars.values())) - 0.05, 1.2)
    ax.set_ylabel("share restored\n(corrupted 0, clean 1)")
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=9, loc="upper left", ncol=3)


def _by_position_figure(
    by_pos: Tensor, all_pos: Tensor, rows: list[str], what: str, title: str, bars: dict, claim: str
):
    """The headline bars on top; then per metric a (rows x position) heatmap and the all-positions column."""
    import matplotlib.pyplot as plt

    H = by_pos.shape[-1]
    tall = 0.3 * len(rows) + 1.2  # inches per heatmap row
    fig = plt.figure(figsize=(13, 3.4 + len(METRICS) * tall), layout="constrained")
    grid = fig.add_gridspec(1 + len(METRICS), 2, width_ratios=[H, 2.5], height_ratios=[3.0] + [tall] * len(METRICS))
    _headline(fig.add_subplot(grid[0, :]), bars, claim)
    limits, maps = (_shared_limit(by_pos), _shared_limit(all_pos)), ([], [])
    for i, metric in enumerate(METRICS):
        ax = fig.add_subplot(grid[1 + i, 0])
        one = _heatmap(ax, by_pos[i].numpy(), rows, list(range(H)),
                       f"{METRIC_LABELS[metric]}: patch one {what} at target position p", limits[0])  # fmt: skip
        ax.set_xlabel("target position p (metric averaged over h >= 2)")
        maps[0].append(ax)
        ax = fig.add_subplot(grid[1 + i, 1])
        every = _heatmap(ax, all_pos[i].numpy()[:, None], rows, ["all p"], "at all positions", limits[1], annotate=True)
        maps[1].append(ax)
    _colour_bars(fig, (one, maps[0]), (every, maps[1]))
    fig.suptitle(title, fontsize=12)
    return fig


def _qk_figure(r: dict, title: str):
    import matplotlib.pyplot as plt

    K1, H = r["query_by_position"].shape[1:]
    rows = subspace_labels(K1 - 1)
    tall = 0.3 * K1 + 1.2  # inches per heatmap row
    fig = plt.figure(figsize=(22, 3.4 + len(METRICS) * tall), layout="constrained")
    grid = fig.add_gridspec(
        1 + len(METRICS), 4, width_ratios=[H, 2.5, H, 2.5], height_ratios=[3.0] + [tall] * len(METRICS)
    )
    bars = {
        "query side alone\n(blocks.1.attn.hook_q)": r["query_all"],
        "key side alone\n(blocks.1.attn.hook_k)": r["key_all"],
        "query and key together": r["query_and_key_all"],
    }
    _headline(
        fig.add_subplot(grid[0, :3]), bars,
        "the whole clean layer-2 input (all subspaces, all positions) patched on the query side, the key side, or both",
    )  # fmt: skip
    limits = [_shared_limit(*(r[f"{side}_{where}"] for side in ("query", "key"))) for where in ("by_position", "all_positions")]
    maps = ([], [])
    for i, metric in enumerate(METRICS):
        for j, side in enumerate(("query", "key")):
            ax = fig.add_subplot(grid[1 + i, 2 * j])
            one = _heatmap(
                ax, r[f"{side}_by_position"][i].numpy(), rows, list(range(H)),
                f"{METRIC_LABELS[metric]}: one subspace on the {side} side (blocks.1.attn.hook_{side[0]}) at position p",
                limits[0],
            )  # fmt: skip
            ax.set_xlabel("target position p")
            maps[0].append(ax)
            ax = fig.add_subplot(grid[1 + i, 2 * j + 1])
            every = _heatmap(ax, r[f"{side}_all_positions"][i].numpy()[:, None], rows, ["all p"], "at all positions",
                             limits[1], annotate=True)  # fmt: skip
            maps[1].append(ax)
    _colour_bars(fig, (one, maps[0]), (every, maps[1]))
    fig.suptitle(title, fontsize=12)
    return fig


def plot(r: dict, n: int, subject_name: str) -> dict:
    """The three figures of the module docstring, by file name."""
    K = r["heads_all_positions"].shape[1]
    heads = [f"{head_label(0, k)} (demo {r['demonstrations'][k]})" for k in range(K)]
    subspaces = subspace_labels(K)
    norm = "normalised: corrupted = 0, clean = 1"
    single = r["heads_all_positions"]  # [metric, head]
    copies = r["subspaces_all_positions"][:, 1:]
    return {
        "heads": _by_position_figure(
            r["heads_by_position"],
            r["heads_all_positions"],
            heads,
            "copyer head's output (hook_z)",
            f"Patching clean copyer-head outputs into the corrupted run ({subject_name}, {n} contexts; {norm})",
            {
                "best single head": single.max(1).values,
                f"sum of the {K} single heads": single.sum(1),
                f"all {K} heads at once": r["all_heads"],
            },
            "one copyer head at a time (all positions) against all of them at once",
        ),
        "subspaces": _by_position_figure(
            r["subspaces_by_position"],
            r["subspaces_all_positions"],
            subspaces,
            "residual subspace (blocks.0.hook_resid_post)",
            f"Patching clean residual subspaces into the corrupted run ({subject_name}, {n} contexts; {norm})",
            {
                "token subspace": r["subspaces_all_positions"][:, 0],
                "best single copy subspace": copies.max(1).values,
                f"sum of the {K} copy subspaces": copies.sum(1),
            },
            "the token subspace (shared by clean and corrupted) against each head's copy subspace (all positions)",
        ),
        "qk": _qk_figure(
            r, f"Patching the layer-2 query vs key input by subspace ({subject_name}, {n} contexts; {norm})"
        ),
    }


def summary(r: dict) -> str:
    """The short text summary printed on stdout."""
    lines = []
    for i, m in enumerate(METRICS):
        heads = r["heads_all_positions"][i]
        lines.append(
            f"{m}: clean {r['clean_mean'][i]:.4f}, corrupted {r['corrupted_mean'][i]:.4f} "
            f"(equal at {100 * r['equal_share'][i]:.1f}% of (context, h>=2); h<2 excluded) | all heads "
            f"{r['all_heads'][i]:.6f}, nothing {r['nothing'][i]:.6f} | per head (all positions) "
            f"{heads.min():.3f}..{heads.max():.3f}, sum {heads.sum():.3f} | query {r['query_all'][i]:.3f}, "
            f"key {r['key_all'][i]:.3f}, query+key {r['query_and_key_all'][i]:.6f} | token subspace: "
            f"query {r['query_all_positions'][i, 0]:.2g}, key {r['key_all_positions'][i, 0]:.2g}"
        )
    lines.append(f"true parent unchanged in G' at {100 * r['same_parent_share']:.1f}% of positions h >= 2")
    return "\n".join(lines)


def compute(subject: DisentangledSubject, config: Config) -> dict:
    generator = torch.Generator().manual_seed(config.seed)
    tokens, parents = subject.task.sample(config.n_contexts, generator)  # corrupted demos: same generator, next draws
    return activation_patching(subject, tokens.to(subject.device), parents, generator)


def figures(result: common.Result) -> dict:
    r = result.data
    return {f"{NAME}_{name}": fig for name, fig in plot(r, result.config.n_contexts, result.title).items()}


ANALYSIS = common.register(globals())
