"""Nichani et al.'s headline on their own DAGs: how much layer 1 attends from a position to its parent.

    python -m analyses.nichani_dags --dags 0-19 --steps 4096 --jobs 1 --threads 1 --out runs/nichani_dags
    python -m analyses.nichani_dags --model gpt2 --dags 0-4 --steps 2000 --batch-size 256 --out runs/nichani_gpt2
    python -m analyses.nichani_dags --sweep docs/reproductions/nichani_dags_catformer.json \\
        docs/reproductions/nichani_dags.json                                # re-plot sweeps, side by side

Their ``many_graphs.ipynb`` draws 20 DAGs (``probes.jax_random.nichani_dags``, bit for bit), trains a
CatFormer per DAG, and reports the mean over DAGs of the attention that layer 1 puts from each position i on
its parent p(i) (the softmax of the causally masked positional block of its A, averaged over the DAG's edges):
0.837 +- 0.054 (the standard deviation over the 20 DAGs; their per-DAG values, printed by the notebook, are
``THEIRS_PER_DAG``). Each DAG here is a job of ``models.training.sweep.run_jobs``:

- ``--model catformer`` (default): the CatFormer trained by ``models.training.catformer`` with their recipe
  (heads [1, 1], zero init, SGD at lr 1, batches of 1024 fresh sequences, the loss on the last position
  against the true distribution of the token it predicts; their DAG, roots from each context's stationary
  distribution and a uniform test token: ``nichani_dag:index=I:kernel=dirichlet:root=stationary``), and their
  measure read from its A (``CatFormer.positional_attention``, ``probes.metrics.dag_parent_mass``). Their
  2^14 steps is the default; ``--steps`` shortens it (the JSON records each DAG's measure along training).
  Each DAG's model is kept under ``OUT/models/dag_II/`` (``catformer.npz``, task.json, training.json).
- ``--model gpt2``: a standard GPT-2 (``models.standard --loss-on last``, one head a layer, AdamW), whose
  measure is the attention pattern itself (content included) from i to p(i): a GPT-2 has no positional block.

Both also report the pattern itself (content included) on ``--n-contexts`` held-out contexts, per head. Each
finished DAG is appended at once to ``OUT/nichani_dags_partial.jsonl`` with the run's settings; re-running the
same command resumes from it (a file holding another run's DAGs is refused), and Ctrl-C stops the workers,
keeps every finished DAG and exits 130. ``--sweep`` re-plots finished JSONs or partial files, one per model
(a partial file mixing runs is refused; a DAG written twice by one run counts once), never over a file it reads.
"""

from __future__ import annotations

from pathlib import Path

from analyses import common
from models.plumbing.io import UsageError
from models.training import sweep

NAME = "nichani_dags"
DEFAULTS = {  # per model: steps, batch size, learning rate (the CatFormer's are their notebook's)
    "catformer": {"steps": 2**14, "batch_size": 2**10, "lr": 1.0},
    "gpt2": {"steps": 6000, "batch_size": 512, "lr": 1e-3},
}


def parse_dags(text: str) -> list[int]:
    """``"0-19"``, ``"3"`` or ``"0,2,5"`` -> DAG indices (one UsageError otherwise)."""
    out = []
    for part in text.split(","):
        a, dash, b = part.partition("-")
        if not (a.isdigit() and (not dash or b.isdigit())):
            raise UsageError(f"--dags {text!r}: expected indices like 0-19, 3 or 0,2,5")
        out += list(range(int(a), int(b) + 1)) if dash else [int(a)]
    if not out or min(out) < 0 or max(out) > 19 or len(set(out)) != len(out):
        raise UsageError(f"--dags {text!r}: expected distinct indices in 0..19 (their 20 DAGs)")
    return out


class Config(sweep.SweepConfig):
    """What ``run`` computes: every field is also a flag."""

    model: str = common.option("catformer", "catformer (theirs, their recipe: the default) or gpt2 (a standard "
                               "GPT-2, AdamW)", choices=tuple(sorted(DEFAULTS)))  # fmt: skip
    dags: str = common.option("0-19", "which of their 20 DAGs to train: 0-19, 3 or 0,2,5")
    steps: int | None = common.option(None, f"training steps per DAG (default: catformer {DEFAULTS['catformer']['steps']}, "
                                      f"their notebook's; gpt2 {DEFAULTS['gpt2']['steps']})", minimum=1, maximum=10**8)  # fmt: skip
    batch_size: int | None = common.option(None, f"sequences per step (default: catformer "
                                           f"{DEFAULTS['catformer']['batch_size']}, their notebook's; gpt2 "
                                           f"{DEFAULTS['gpt2']['batch_size']})", minimum=1, maximum=2**24)  # fmt: skip
    lr: float | None = common.option(None, f"learning rate (the CatFormer's: plain SGD, default {DEFAULTS['catformer']['lr']}, "
                                     f"their notebook's; the GPT-2's: AdamW, default {DEFAULTS['gpt2']['lr']})")  # fmt: skip
    n_contexts: int = common.n_contexts(256, "held-out contexts of the attention pattern")
    sweep: tuple[str, ...] | None = common.option(None, "re-plot these files instead of training: the JSON an earlier "
                                                  f"run wrote, or the {NAME}_partial.jsonl of a stopped one; one per "
                                                  "model, drawn side by side", metavar="FILE")  # fmt: skip
    work_dir: str | None = common.option(None, f"folder for the trained models and {NAME}_partial.jsonl, the record of "
                                         "the finished DAGs from which a stopped run resumes (default: --out; from "
                                         "Python: none, nothing kept)", same_numbers=True)  # fmt: skip

    def validate(self):
        super().validate()
        parse_dags(self.dags)
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"lr must be a positive number, got {self.lr}")

    def recipe(self) -> dict:
        """Steps, batch size and learning rate: those given, else the model's ``DEFAULTS``."""
        return {k: v if getattr(self, k) is None else getattr(self, k) for k, v in DEFAULTS[self.model].items()}

    def reads(self) -> list[str]:
        """The files it re-plots (no output may be one)."""
        return list(self.sweep or ())


REQUIRES = None  # its own synthetic tasks: no --checkpoint

common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import dataclasses
import json
import math
import tempfile
import time

import numpy as np
import torch

from models.plumbing.io import check_memory, exclusive_lock, size
from models.training.catformer import CatFormerTrainConfig, draw, save_catformer, train_catformer
from models.training.standard import StandardConfig, train_standard

THEIRS = {"mean": 0.83663917, "std": 0.054017633, "n_dags": 20}  # many_graphs.ipynb's printed output
# 1 - their printed jnp.sum(deltas) / jnp.sum(A) for trials 0..19 (the same notebook's output): the mean and
# standard deviation of these are THEIRS to 1e-8.
THEIRS_PER_DAG = [1 - x for x in (
    0.07311729, 0.20035921, 0.14203162, 0.19404776, 0.14367652, 0.14427443, 0.18341547, 0.1601731, 0.108907215,
    0.18736368, 0.15590227, 0.09343498, 0.23779623, 0.32539037, 0.12154283, 0.19047198, 0.14649051, 0.12588786,
    0.13636747, 0.19656566,
)]  # fmt: skip
SEQ_LEN, D_VOCAB, ALPHA = 21, 3, 0.1  # their T = 20 inputs, then the token the read-out predicts; vocabulary 3
GPT2 = dict(d_vocab=D_VOCAB, n_examples=0, seq_len=SEQ_LEN, alpha=ALPHA, n_layers=2, n_heads=1, d_model=64, d_mlp=128,
            loss_on="last")  # fmt: skip
REPRO = Path(__file__).resolve().parent.parent / "docs" / "reproductions"
COMMITTED = {"catformer": REPRO / "nichani_dags_catformer.json", "gpt2": REPRO / "nichani_dags.json"}
# analyses.paper re-plots the committed sweeps (each DAG trains for minutes; the paper run takes seconds)
PAPER_ARGS = ["--sweep", str(COMMITTED["catformer"]), str(COMMITTED["gpt2"])]
FIGURES = {
    f"{NAME}.png": (
        "layer 1's attention from each position to its parent on each of Nichani et al.'s 20 DAGs: the CatFormer "
        "trained here with their recipe (their measure, from A), theirs per DAG (their notebook), and a GPT-2 on "
        "DAGs 0-4 (its attention pattern); re-plotted from docs/reproductions/nichani_dags_catformer.json and "
        "nichani_dags.json"
    ),
}


def spec(index: int, model: str) -> str:
    root = ":root=stationary" if model == "catformer" else ""  # the GPT-2's Bayes evaluation needs uniform roots
    return f"nichani_dag:index={index}:kernel=dirichlet{root}"


def edges_of(parents: list[list[int]], T: int = SEQ_LEN - 1) -> list[tuple[int, int]]:
    """Their DAG's edges (i, p(i)) over their T positions (the test token has none; its child is not theirs)."""
    return [(i, ps[0]) for i, ps in enumerate(parents[:T]) if len(ps) == 1]


def pattern_on_parent(patterns: list[torch.Tensor], edges) -> list[list[float]]:
    """Per layer and head, the pattern's mass from i on p(i) (``[batch, head, q, k]`` each), averaged over
    contexts and edges."""
    return [[float(np.mean([p[:, h, i, j].double().mean().item() for i, j in edges])) for h in range(p.shape[1])]
            for p in patterns]  # fmt: skip


def dag_record(index: int, model: str, task, edges, per_edge, last_nll: float, last_nll_bayes: float,
               clock: tuple[float, float], **measures) -> dict:  # fmt: skip
    """One DAG's result as plain data: what every model's job records, its ``measures``, and the wall and CPU
    seconds since ``clock`` (``perf_counter``, ``process_time``)."""
    return {"index": index, "model": model, "parents": task.parents, "edges": edges, "attention_on_parent": per_edge,
            **measures, "last_nll": last_nll, "last_nll_bayes": last_nll_bayes,
            "seconds": time.perf_counter() - clock[0], "cpu_seconds": time.process_time() - clock[1]}  # fmt: skip


def train_catformer_dag(index: int, steps: int, batch_size: int, lr: float, seed: int, n_contexts: int,
                        save_to: str | None = None) -> dict:  # fmt: skip
    """One job: their CatFormer recipe on DAG ``index``; their measure (from A) per edge and its mean, the
    pattern itself on held-out contexts, the evaluation history (plain data)."""
    clock = time.perf_counter(), time.process_time()
    cfg = CatFormerTrainConfig(task_kind=spec(index, "catformer"), d_vocab=D_VOCAB, seq_len=SEQ_LEN, alpha=ALPHA,
                               steps=steps, batch_size=batch_size, lr=lr, seed=seed, eval_every=max(steps // 16, 1))  # fmt: skip
    model, history = train_catformer(cfg)
    task, T = cfg.task(), SEQ_LEN - 1
    edges = edges_of(task.parents)
    soft = model.positional_attention(0, 0)
    tokens, _ = draw(task, n_contexts, torch.Generator().manual_seed(seed + 2_000_003))
    store = {}
    hooks = [(f"blocks.{i}.attn.hook_pattern", lambda p, hook, i=i: store.__setitem__(i, p)) for i in range(2)]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        model(tokens[:, :T])
    if save_to is not None:
        save_catformer(model, save_to, cfg, history, replace=True)
    per_edge = [soft[i, p].item() for i, p in edges]  # their measure, per edge
    return dag_record(
        index, "catformer", task, edges, per_edge, history[-1]["last_nll"], history[-1]["last_nll_bayes"], clock,
        parent_attention=float(np.mean(per_edge)),
        pattern_on_parent=pattern_on_parent([store[0], store[1]], edges),  # [layer][head]
        history=[{k: h[k] for k in ("step", "parent_attention", "last_nll")} for h in history],
    )


def train_gpt2_dag(index: int, steps: int, batch_size: int, lr: float, seed: int, n_contexts: int,
                   save_to: str | None = None) -> dict:  # fmt: skip
    """One job: a GPT-2 (``models.standard --loss-on last``) on DAG ``index``, then the layer-0 attention
    pattern on each edge, per head (plain data). ``save_to``: unused (the GPT-2 is not kept)."""
    clock = time.perf_counter(), time.process_time()
    cfg = StandardConfig(**GPT2, task_kind=spec(index, "gpt2"), steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                         eval_every=steps, eval_contexts=512)  # fmt: skip
    model, history = train_standard(cfg, progress=False, save=False)
    task = cfg.task()
    tokens, _ = task.sample(n_contexts, torch.Generator().manual_seed(seed + 2_000_003))
    model.config._attn_implementation = "eager"  # SDPA returns no attention pattern
    with torch.no_grad():
        att = model(tokens, output_attentions=True).attentions  # per layer [batch, head, T, T]
    edges = edges_of(task.parents, len(task.parents) - 1)
    per_edge = [[[att[layer][:, h, i, p].mean().item() for i, p in edges] for h in range(att[layer].shape[1])]
                for layer in range(len(att))]  # fmt: skip
    means = [[float(np.mean(e)) for e in layer] for layer in per_edge]
    return dag_record(index, "gpt2", task, edges, per_edge, history[-1]["last_nll"], history[-1]["last_nll_bma"], clock,
                      mean_attention_on_parent=means, parent_attention=means[0][0])  # per_edge: [layer][head][edge]


TRAIN = {"catformer": train_catformer_dag, "gpt2": train_gpt2_dag}


def context_bytes(model: str) -> int:
    """Memory of one held-out context's measurement, float32: every layer's patterns and residual (the
    CatFormer's widths 23 and 46, the GPT-2's 64), with the logits and a copy of each for the read-out."""
    T = SEQ_LEN - 1 if model == "catformer" else SEQ_LEN
    width = 23 + 46 + 92 if model == "catformer" else 2 * 64 * 12
    return 4 * T * (2 * 2 * T + width) * 2


def run_record(config: Config) -> dict:
    """The settings that make a DAG's result what it is (every line of the partial file carries them)."""
    return {"model": config.model, **config.recipe(), "seed": config.seed, "n_contexts": config.n_contexts}


def read_partial(path: Path) -> list[dict]:
    """The DAGs a partial file holds, each once (the first line of an index; every line of one run), sorted
    by index; one UsageError if it mixes runs of different settings."""
    runs: dict[int, dict] = {}
    settings = []
    text = Path(path).read_text()
    if text and not text.endswith("\n"):  # a line being written, or cut short: not a record yet
        text = text[: text.rfind("\n") + 1]
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            index = r["index"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UsageError(f"{path}: line {n} is not a DAG's result of analyses.{NAME}") from None
        why = unusable(r)
        if why:
            raise UsageError(f"{path}: line {n}, DAG {index!r}: {why}; expected a finished DAG's result of analyses.{NAME}")
        if r.get("run") not in settings:
            settings.append(r.get("run"))
        runs.setdefault(index, r)
    if len(settings) > 1:
        raise UsageError(
            f"{path} mixes the DAGs of {len(settings)} runs of different settings ({settings[0]} and {settings[1]}); "
            "expected one run's: re-plot each run's own file"
        )
    return [runs[i] for i in sorted(runs)]


def finished(partial: Path, run: dict) -> dict[int, dict]:
    """The DAGs a stopped run of these settings finished in ``partial`` ({} if none); one UsageError if it
    holds another run's DAGs (nothing is mixed into it)."""
    if not partial.exists():
        return {}
    done = read_partial(partial)
    if done and done[0].get("run") != run:
        raise UsageError(
            f"{partial} holds the DAGs of another run ({done[0].get('run')}), not of these settings ({run}); "
            "choose another --out, or re-plot it with --sweep"
        )
    return {r["index"]: r for r in done}


def compute(subject, config: Config) -> dict:
    if config.sweep is not None:
        for f in config.sweep:
            if not Path(f).is_file():
                raise UsageError(f"sweep {f}: no such file; expected the JSON an earlier run of analyses.{NAME} wrote")
        return {"sweeps": [read_sweep(f) for f in config.sweep]}
    check_memory(config.n_contexts * context_bytes(config.model), f"--n-contexts {config.n_contexts} "
                 f"({size(context_bytes(config.model))} a context)")  # fmt: skip
    recipe, record, dag_list = config.recipe(), run_record(config), parse_dags(config.dags)
    if config.model == "catformer":
        CatFormerTrainConfig(task_kind=spec(0, "catformer"), **recipe)
    if config.work_dir is None:
        with tempfile.TemporaryDirectory() as tmp:
            return compute(None, dataclasses.replace(config, work_dir=tmp))
    out = Path(config.work_dir)
    out.mkdir(parents=True, exist_ok=True)
    # one run at a time in a folder: a second one is refused at once (it would write the same records)
    with exclusive_lock(out / f".{NAME}.lock", wait=False, what=f"the {NAME} sweep in {str(out)!r}"):
        return sweep_dags(config, out, dag_list, recipe, record)


def sweep_dags(config: Config, out: Path, dag_list: list[int], recipe: dict, record: dict) -> dict:
    """Train the DAGs of ``dag_list`` not yet in ``out``'s record, each appended to it as it finishes."""
    partial = out / f"{NAME}_partial.jsonl"  # each finished DAG at once, so a stopped sweep keeps its runs
    repair_torn(partial)
    finished_before = finished(partial, record)  # before any work: another run's record refused
    todo = [i for i in dag_list if i not in finished_before]
    if len(todo) < len(dag_list):
        print(f"  resuming: DAGs {sorted(set(dag_list) - set(todo))} finished earlier ({partial})", flush=True)
    kept = []

    def done(i, run):
        run["run"] = record
        with partial.open("a") as f:
            f.write(json.dumps(run) + "\n")
        kept.append(run["index"])
        print(f"  DAG {run['index']}: attention on the parent {run['parent_attention']:.3f} "
              f"({run['seconds']:.0f} s wall, {run['cpu_seconds']:.0f} s CPU)", flush=True)  # fmt: skip

    kwargs = [dict(index=i, **recipe, seed=config.seed, n_contexts=config.n_contexts,
                   save_to=str(out / "models" / f"dag_{i:02d}")) for i in todo]  # fmt: skip
    try:
        sweep.run_jobs(TRAIN[config.model], kwargs, config.cluster, config.jobs, on_done=done)
    except KeyboardInterrupt:
        n = len(finished_before) + len(kept)
        raise KeyboardInterrupt(f"{n} finished DAGs kept in {partial}; the same command resumes from them") from None
    runs = [r for r in read_partial(partial) if r["index"] in dag_list]
    return {"sweeps": [{"model": config.model, **record, "runs": runs, **aggregate(runs)}]}


def repair_torn(partial: Path) -> None:
    """A record whose last line was cut short (a full disk, a kill during the write) is cut back to its last whole
    line, said in one line: the DAGs before it are kept, the torn one is trained again."""
    if not partial.exists():
        return
    data = partial.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    keep = data.rfind(b"\n") + 1
    with partial.open("r+b") as f:
        f.truncate(keep)
    print(f"  {partial}: dropped its torn last line ({len(data) - keep} bytes, a write cut short); the DAGs before "
          "it are kept", flush=True)


def shown(path: str) -> str:
    """A file read, as the JSON records it: relative to the repository if inside it (the same on every machine)."""
    where, root = Path(path).resolve(), common.FIGURES_DIR.parent
    return str(where.relative_to(root)) if where.is_relative_to(root) else str(where)


def read_sweep(path: str) -> dict:
    """One model's sweep from a file: a JSON an earlier run wrote (its first sweep, with the command that trained
    it) or a partial file (its DAGs, each once)."""
    if path.endswith(".jsonl"):
        runs = read_partial(Path(path))
        if not runs:
            raise UsageError(f"--sweep {path}: no finished DAG in it")
        record = runs[0].get("run") or {}
        return {"model": runs[0].get("model", "gpt2"), **record, "runs": runs, **aggregate(runs), "source": shown(path)}
    try:
        d = json.loads(Path(path).read_text())
        res = d["results"]
        res = res["sweeps"][0] if "sweeps" in res else {"model": "gpt2", **res}  # the GPT-2 sweep's first layout
        runs = res["runs"]
    except (json.JSONDecodeError, KeyError, TypeError, IndexError):
        raise UsageError(f"--sweep {path}: not the JSON of analyses.{NAME} (results.sweeps or results.runs)") from None
    keep = {k: v for k, v in res.items() if k not in ("runs", "sweep", "source", "theirs", "trained_by")}
    return {**keep, "runs": runs, **aggregate(runs), "source": shown(path),
            "trained_by": d.get("command")}


def unusable(run: dict) -> str | None:
    """Why a DAG's record cannot be counted (a resumed or re-plotted one): its index out of 0..19, no headline
    number, or a number that is not finite anywhere in it; None if it can."""
    def numbers(x):
        if isinstance(x, dict):
            return [v for value in x.values() for v in numbers(value)]
        if isinstance(x, list):
            return [v for value in x for v in numbers(value)]
        return [x] if isinstance(x, float) else []

    if not isinstance(run.get("index"), int) or not 0 <= run["index"] < len(THEIRS_PER_DAG):
        return f"index must be one of their DAGs 0..{len(THEIRS_PER_DAG) - 1}"
    if "parent_attention" not in run and "mean_attention_on_parent" not in run:
        return "it holds neither parent_attention nor mean_attention_on_parent"
    if not all(math.isfinite(v) for v in numbers(run)):
        return "it holds a number that is not finite (NaN or infinity)"
    return None


def headline(run: dict) -> float:
    """A DAG's number: the CatFormer's their measure; the GPT-2's L0H0 pattern (its first JSON had no key)."""
    return run["parent_attention"] if "parent_attention" in run else run["mean_attention_on_parent"][0][0]


def aggregate(runs: list[dict]) -> dict:
    """Over DAGs: mean, standard deviation (NumPy's, as theirs), standard error of the mean; and, DAG by DAG,
    ours minus theirs (``THEIRS_PER_DAG``): its mean and standard error."""
    per_dag = np.array([headline(r) for r in runs])
    diff = per_dag - np.array([THEIRS_PER_DAG[r["index"]] for r in runs])
    n = len(runs)
    se = float(per_dag.std(ddof=1) / math.sqrt(n)) if n > 1 else None
    return {
        "n_dags": n,
        "mean": float(per_dag.mean()),
        "std": float(per_dag.std()),
        "se": se,
        "minus_theirs": {"mean": float(diff.mean()), "se": float(diff.std(ddof=1) / math.sqrt(n)) if n > 1 else None},
        "theirs": THEIRS,
        "theirs_same_dags": float(np.mean([THEIRS_PER_DAG[r["index"]] for r in runs])),
    }


LABELS = {"catformer": "CatFormer trained here (their measure, from A)", "gpt2": "GPT-2 (its pattern, L0H0)"}
COLOURS = {"catformer": "tab:blue", "gpt2": "tab:green"}


def figures(result: common.Result):
    res = result.data
    import matplotlib.pyplot as plt

    sweeps = res["sweeps"]
    width = 0.8 / (len(sweeps) + 1)
    fig, ax = plt.subplots(figsize=(9, 5), layout="constrained")
    ax.bar(np.arange(20) - 0.4 + width / 2, THEIRS_PER_DAG, width, color="tab:orange",
           label=f"theirs (CatFormer, their notebook): {THEIRS['mean']:.3f} ± {THEIRS['std']:.3f} (sd), 20 DAGs")  # fmt: skip
    for k, s in enumerate(sweeps):
        idx = np.array([r["index"] for r in s["runs"]])
        se = f", SE {s['se']:.3f}" if s["se"] is not None else ""
        ax.bar(idx - 0.4 + (k + 1.5) * width, [headline(r) for r in s["runs"]], width, color=COLOURS[s["model"]],
               label=f"{LABELS[s['model']]}: {s['mean']:.3f} ± {s['std']:.3f} (sd{se}), {s['n_dags']} DAGs")  # fmt: skip
    ax.set(xlabel="their DAG (index into many_graphs.ipynb's 20)", ylabel="attention from i on its parent p(i)",
           ylim=(0, 1.02), xticks=range(20), xlim=(-0.6, 19.6))  # fmt: skip
    steps = ", ".join(f"{s['model']} {s.get('steps', '?')} steps x {s.get('batch_size', '?')}" for s in sweeps)
    ax.set_title(f"Layer-1 attention from each position to its parent, their 20 DAGs\n({steps}; theirs 16384 x 1024)",
                 fontsize=10)  # fmt: skip
    fig.legend(loc="outside lower center", ncol=1, fontsize=9, frameon=False)
    return {NAME: fig}


def summary(res: dict) -> str:
    lines = []
    for s in res["sweeps"]:
        d = s["minus_theirs"]
        paired = f"; minus theirs DAG by DAG {d['mean']:+.3f} +- {d['se']:.3f} (SE)" if d["se"] is not None else ""
        se = f", SE {s['se']:.3f}" if s["se"] is not None else ""
        lines.append(
            f"{NAME} ({s['model']}, {s.get('steps', '?')} steps of {s.get('batch_size', '?')}): {s['n_dags']} of their "
            f"20 DAGs; attention on the parent {s['mean']:.3f} +- {s['std']:.3f} (sd over DAGs{se}); theirs "
            f"{THEIRS['mean']:.3f} +- {THEIRS['std']:.3f} over 20, {s['theirs_same_dags']:.3f} on these DAGs{paired}"
        )
        for r in s["runs"]:
            cpu = f", {r['cpu_seconds']:.0f} s CPU" if "cpu_seconds" in r else ""
            bayes = "their Bayes, the roots unread" if r.get("model") == "catformer" else "Bayes"
            lines.append(f"  DAG {r['index']:2d}: {len(r['edges'])} edges, {headline(r):.3f} (theirs "
                         f"{THEIRS_PER_DAG[r['index']]:.3f}); last-token NLL {r['last_nll']:.4f} ({bayes} "
                         f"{r.get('last_nll_bayes', r.get('last_nll_bma', float('nan'))):.4f}){cpu}")  # fmt: skip
    return "\n".join(lines)


ANALYSIS = common.register(globals())
