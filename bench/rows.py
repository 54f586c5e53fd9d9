"""The rows of ``python -m bench`` (its docstring says what each measures): each a function returning its
row(s), called by ``bench.__main__`` once the flags are parsed."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

from bench.circuit_reference import exact_values_per_edge, keep_only_values_per_receiver
from bench.deepened import deepen
from bench.reference import bma_posterior_loop, reference_model
from models import CausalTransformer, load_subject
from models.interp.circuit import (
    CircuitConfig,
    Runner,
    build_graph,
    curve_sizes,
    discover,
    eap_ig_scores,
    eap_scores,
    exact_scores,
    per_context_nll,
    ratio_se,
    source_writes,
    top_n,
)
from models.loading.named import STANDARD_CHECKPOINT
from models.nets import causal_transformer
from models.plumbing.io import UsageError
from models.training.optim import keep_freed_memory, sample_batch
from models.training.train import PRESETS, TrainConfig, init_copyers, step_loss, train
from probes import bma_posterior, bma_predictive

# (name, d, L = K, H, batch): the reference's full score matrix outgrows the default batch at scale.
SIZES = [("small", 5, 10, 12, 256), ("medium", 10, 32, 24, 64), ("large", 20, 64, 32, 8)]


MEMORY_SIZE = (20, 64, 32, 256)  # d, L = K, H, batch of the cached forward


ROOT = Path(__file__).resolve().parent.parent


CIRCUIT_CONTEXTS, CIRCUIT_CURVE_POINTS = 128, 8  # analyses.circuit's defaults (--n-contexts, --curve-points)


def machine(device: str) -> str:
    """One line: CPU model, cores, threads, torch and Python versions (and the GPU if used)."""
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = (
        f"{cpu}, {os.cpu_count()} cores ({torch.get_num_threads()} torch threads), torch {torch.__version__}, "
        f"Python {platform.python_version()}, {datetime.date.today().isoformat()}, "
        f"load average {os.getloadavg()[0]:.1f} at the start"
    )
    if device.startswith("cuda"):
        text += f", GPU {torch.cuda.get_device_name(torch.device(device))}"
    return text


def _median_time(fn, repeat: int, device: str, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` over ``repeat`` calls after ``warmup`` untimed ones."""
    times = []
    for i in range(warmup + repeat):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _subject(d: int, L: int, H: int, batch: int, device: str, seed: int = 0):
    """A model with the default initialisation and random layer-2 weights, its task and a batch."""

    cfg = TrainConfig(d_vocab=d, n_examples=L, seq_len=H, device=device, seed=seed)
    task = cfg.task()
    generator = torch.Generator().manual_seed(seed)
    model = CausalTransformer(cfg.model_config())
    init_copyers(model, cfg.init_offset, cfg.init_demo, generator)
    with torch.no_grad():
        model.W_KQ.normal_(0, 0.1, generator=generator)
        model.W_OV.normal_(0, 0.1, generator=generator)
    tokens, _ = task.sample(batch, generator)
    return model, task, tokens


def _interleaved_times(fns: dict, reps: dict, device: str, warmup: int = 1) -> dict:
    """Median wall time of each ``fns[label]()`` over ``reps[label]`` calls, the calls interleaved (round after
    round, each label once a round while it has calls left) after ``warmup`` untimed calls of each: a change of
    the machine's load during the row reaches both sides of its ratio alike."""
    for label, fn in fns.items():
        for _ in range(warmup):
            fn()
    times: dict = {label: [] for label in fns}
    for i in range(max(reps.values())):
        for label, fn in fns.items():
            if i < reps[label]:
                times[label].append(_median_time(fn, 1, device, warmup=0))
    return {label: statistics.median(t) for label, t in times.items()}


STEP_REPEATS = {"small": (15, 15), "medium": (15, 3), "large": (5, 1)}  # (ours, reference) timed steps a size
# (the reference takes 30 ms, 1.5 s and 17 s a step on this machine's one thread). Three of each, timed one side
# after the other, gave small 1.7x to 3.4x and medium 33x to 48x in four runs of one commit here (2026-12-07).


def step_rows(sizes, repeat: int, device: str) -> list[dict]:
    """Training step (forward, backward, Adam) of our model and of the full-matrix reference, timed interleaved
    (``_interleaved_times``; ``STEP_REPEATS`` steps each, one each with ``--quick``)."""

    rows = []
    for name, d, L, H, batch in sizes:
        torch.manual_seed(0)
        model, _, tokens = _subject(d, L, H, batch, device)
        reference = reference_model(model)
        target = tokens[:, -H:].to(device)
        with torch.no_grad():  # the reference computes the same function: check before timing it
            err = (model(tokens[:4]) - reference(tokens[:4])).abs().max().item()
        steps = {}
        for label, net in (("ours", model), ("reference", reference)):
            opt = torch.optim.Adam(net.parameters(), lr=1e-3)

            def step(net=net, opt=opt, tokens=tokens, target=target):
                loss = step_loss(net, tokens, target)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

            steps[label] = step
        ours, theirs = STEP_REPEATS.get(name, (5, 1)) if repeat > 1 else (1, 1)
        timed = _interleaved_times(steps, {"ours": ours, "reference": theirs}, device, warmup=int(name != "large"))
        rows.append(
            {
                "row": f"train step, {name} (d={d}, L=K={L}, H={H}, batch {batch})",
                "ours_s": timed["ours"],
                "baseline_s": timed["reference"],
                "baseline": "full-matrix RPE reference",
                "ratio": timed["reference"] / timed["ours"],
                "note": f"same outputs to {err:.1e}; medians of {ours} and {theirs} steps, interleaved",
            }
        )
    return rows


def cache_rows(repeat: int, device: str, batch: int = 2048) -> list[dict]:
    """``run_with_cache`` against a plain forward at the default size: every hook (the default), and
    with ``cfg.use_attn_result`` on (per-head results ``blocks.0.attn.hook_result``, K(K+1)d numbers a position)."""
    model, _, tokens = _subject(5, 10, 12, batch, device)
    rows = []
    with torch.no_grad():
        plain = _median_time(lambda: model(tokens), 3 * repeat, device)
        for note, per_head in (("every hook (default)", False), ("every hook, use_attn_result on", True)):
            model.cfg.use_attn_result = per_head
            cached = _median_time(lambda: model.run_with_cache(tokens), 3 * repeat, device)
            rows.append(
                {
                    "row": f"run_with_cache / forward (d=5, L=K=10, H=12, batch {batch})",
                    "ours_s": cached,
                    "baseline_s": plain,
                    "baseline": "plain forward",
                    "ratio": cached / plain,
                    "note": note,
                }
            )
    return rows


def bma_row(repeat: int, batch: int = 256) -> dict:
    """``probes.bma_posterior`` (vectorised, torch) against Lemma 1 as a per-context NumPy loop."""

    _, task, tokens = _subject(5, 10, 12, batch, "cpu")
    L, H = task.n_examples, task.seq_len
    err = abs(bma_posterior_loop(task.pi, tokens, L, H) - bma_posterior(task.pi, tokens, L, H).numpy()).max()
    fast = _median_time(lambda: bma_posterior(task.pi, tokens, L, H), 3 * repeat, "cpu")
    slow = _median_time(lambda: bma_posterior_loop(task.pi, tokens, L, H), repeat, "cpu")
    return {
        "row": f"BMA posterior, vectorised (d=5, L=10, H=12, {batch} contexts)",
        "ours_s": fast,
        "baseline_s": slow,
        "baseline": "per-context loop",
        "ratio": slow / fast,
        "note": f"same to {err:.1e}",
    }


def _proc_status(field: str) -> int:
    """A memory field of /proc/self/status in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise UsageError(f"/proc/self/status has no {field}; the memory row needs Linux")


def _reset_peak(device: str) -> int:
    """Reset the peak-memory counter to the current use and return that use (bytes). On CPU the
    peak is the process's VmHWM, reset by writing 5 to /proc/self/clear_refs (ru_maxrss cannot be
    reset and even carries the parent's peak across fork and exec)."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(torch.device(device))
        return torch.cuda.memory_allocated(torch.device(device))
    Path("/proc/self/clear_refs").write_text("5")
    return _proc_status("VmRSS")


def _peak(device: str) -> int:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(torch.device(device))
    return _proc_status("VmHWM")


def _run_fresh(name: str, *args):
    """``bench.rows.<name>(*args)`` in a fresh interpreter (none of this process's state, its allocator
    settings included), and what it returned (through JSON)."""
    code = f"import json; from bench.rows import {name}; print(json.dumps({name}(*{args!r})))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _memory_child(device: str) -> dict:
    """Run in a fresh process: peak memory of a plain forward, then of ``run_with_cache``, each
    above the memory in use just before it."""
    d, L, H, batch = MEMORY_SIZE
    model, _, tokens = _subject(d, L, H, batch, device)
    with torch.no_grad():
        before = _reset_peak(device)
        model(tokens)
        after_forward = _peak(device)
        _reset_peak(device)
        model.cfg.use_attn_result = True  # the worst case: every hook, per-head results included
        _, cache = model.run_with_cache(tokens)
        after_cache = _peak(device)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in cache.values()}
    result_bytes = cache["blocks.0.attn.hook_result"].untyped_storage().nbytes()
    return {
        "before": before,
        "forward": after_forward,
        "cache": after_cache,
        "cache_tensors": sum(storages.values()),
        "hook_result": result_bytes,
    }


def memory_row(device: str) -> dict:
    """Peak memory of a cached forward at L=K=64, H=32, batch 256, measured in a fresh process."""
    m = _run_fresh("_memory_child", device)
    gb = 2**30
    method = "torch.cuda.max_memory_allocated" if device.startswith("cuda") else "peak RSS (VmHWM, reset before each)"
    d, L, H, batch = MEMORY_SIZE
    cache, forward = m["cache"] - m["before"], m["forward"] - m["before"]
    return {
        "row": f"peak memory, cached forward (d={d}, L=K={L}, H={H}, batch {batch})",
        "ours_s": None,
        "baseline_s": None,
        "baseline": "plain forward",
        "ratio": cache / forward,
        "note": (
            f"{cache / gb:.2f} GB above the {m['before'] / gb:.2f} GB in use before, vs {forward / gb:.2f} GB "
            f"for a plain forward; cached tensors {m['cache_tensors'] / gb:.2f} GB, "
            f"of which blocks.0.attn.hook_result {m['hook_result'] / gb:.2f} GB; {method}, fresh process"
        ),
    }


def train_row(device: str, steps: int) -> dict:
    """Steps per second of ``models.training.train.train`` at the default config (its loop, one evaluation
    and one checkpoint write at the end included)."""

    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(steps=steps, eval_every=steps, eval_contexts=256, device=device, out=tmp)
        _, history = train(cfg, progress=False)
    seconds = history[-1]["seconds"]
    return {
        "row": "training, default config (d=5, L=K=10, H=12, batch 256)",
        "ours_s": seconds / steps,
        "baseline_s": None,
        "baseline": "",
        "ratio": None,
        "note": f"{steps / seconds:.0f} steps/s ({steps} steps in {seconds:.1f} s)",
    }


# The large preset before (until 2026-12-02: dense copies, float32, the batch sampled on every thread, 3000
# steps) and now (the preset: factored copies, bfloat16 autocast, the batch sampled on one thread, 2200 steps),
# and the labels of their histories.
SCALE_HISTORIES = ROOT / "figures" / "scale_histories.json"


LARGE_BEFORE = "large: float32, 3000 steps (--preset large until 2026-12-02)"


LARGE_NOW = "large: --preset large (bfloat16 autocast, 2200 steps)"


BEFORE_FIELDS = {"autocast": False}


def steps_to_targets(history: list[dict], gap: float = 0.01, tv: float = 0.05) -> int | None:
    """The first evaluated step with the NLL gap to BMA <= ``gap`` and the mean TV <= ``tv``."""
    return next((m["step"] for m in history if m["nll_gap"] <= gap and m["tv_to_bma"] <= tv), None)


def _step_seconds(fields: dict, before: bool, keep: bool, steps: int, device: str) -> float:
    """Seconds a step of ``models.training.train.train`` at the large preset with ``fields`` over it (one 16-context
    evaluation and a checkpoint write included), in a fresh interpreter as ``python -m models.train`` runs
    it; ``before``: the copies through the full pattern and the batch sampled on every thread, as before;
    ``keep``: the freed memory kept (``models.training.optim.keep_freed_memory``, as the command line does), else
    glibc's default."""
    return _run_fresh("_step_seconds_here", fields, before, keep, steps, device, torch.get_num_threads())


def _step_seconds_here(fields: dict, before: bool, keep: bool, steps: int, device: str, threads: int) -> float:
    """``_step_seconds`` in this process (which it changes: with ``keep``, its freed memory is kept)."""
    torch.set_num_threads(threads)
    if keep:
        keep_freed_memory()
    saved = causal_transformer.FACTOR_ABOVE
    causal_transformer.FACTOR_ABOVE = float("inf") if before else saved
    every_thread = mock.patch("models.training.train.sample_batch", lambda task, n, g: task.sample(n, g)[0])
    try:
        with tempfile.TemporaryDirectory() as tmp, every_thread if before else contextlib.nullcontext():
            cfg = TrainConfig(**{**PRESETS["large"], **fields, "steps": steps, "eval_every": steps})
            cfg = dataclasses.replace(cfg, eval_contexts=16, device=device, out=tmp)
            _, history = train(cfg, progress=False)
    finally:
        causal_transformer.FACTOR_ABOVE = saved
    return history[-1]["seconds"] / steps


def sampling_row(repeat: int) -> dict:
    """A large-preset training batch drawn on one thread (``models.training.optim.sample_batch``) against on every
    thread torch has, alternating, median of ``repeat``; the same draws."""
    task, threads = TrainConfig(**PRESETS["large"]).task(), torch.get_num_threads()
    timed = {"one": [], "every": []}
    for _ in range(repeat):
        for key, draw in (("one", sample_batch), ("every", lambda t, n, g: t.sample(n, g)[0])):
            start = time.perf_counter()
            draw(task, 256, torch.Generator().manual_seed(0))
            timed[key].append(time.perf_counter() - start)
    one, every = (statistics.median(timed[k]) for k in ("one", "every"))
    return {
        "row": "large preset, drawing a training batch (256 contexts)",
        "ours_s": one,
        "baseline_s": every,
        "baseline": f"on {threads} threads",
        "ratio": every / one,
        "note": f"one thread; median of {repeat}, alternating",
    }


def large_rows(device: str, steps: int, repeat: int) -> list[dict]:
    """The large preset before and now: the seconds a step of each, measured here side by side (alternating,
    median of ``repeat``, on ``steps`` steps: a shortened run), and the time to the targets (gap <= 0.01,
    TV <= 0.05): those seconds times the steps each recorded run took to the targets
    (figures/scale_histories.json; the row is left out while the new preset's run is not recorded)."""
    timed = {"before": [], "now": [], "unkept": []}
    for _ in range(repeat):
        timed["before"].append(_step_seconds(BEFORE_FIELDS, True, False, steps, device))
        timed["now"].append(_step_seconds({}, False, True, steps, device))
        timed["unkept"].append(_step_seconds({}, False, False, steps, device))
    before, now, unkept = (statistics.median(timed[k]) for k in ("before", "now", "unkept"))
    size = "d=20, L=K=64, H=32, batch 256"
    rows = [
        {
            "row": f"large preset, a training step ({size})",
            "ours_s": now,
            "baseline_s": before,
            "baseline": "before: dense copies, float32, sampled on every thread, glibc's default for freed memory",
            "ratio": before / now,
            "note": f"now: factored copies, bf16 autocast, sampled on one thread, freed memory kept; median of "
            f"{repeat} x {steps} steps each, alternating, each in a fresh process",
        },
        {
            "row": f"large preset, a training step, the freed memory kept ({size})",
            "ours_s": now,
            "baseline_s": unkept,
            "baseline": "the same preset with glibc's default for freed memory",
            "ratio": unkept / now,
            "note": "models.training.optim.keep_freed_memory alone; the same runs as the row above",
        },
    ]
    rows.append(sampling_row(repeat * 5))
    histories = json.loads(SCALE_HISTORIES.read_text())
    if LARGE_NOW in histories:
        n_before = steps_to_targets(histories[LARGE_BEFORE]["history"])
        n_now = steps_to_targets(histories[LARGE_NOW]["history"])
        rows.append(
            {
                "row": f"large preset, time to the targets ({size})",
                "ours_s": now * n_now,
                "baseline_s": before * n_before,
                "baseline": "before",
                "ratio": before * n_before / (now * n_now),
                "note": f"the step times above x the steps to the targets, {n_before} before and {n_now} now; "
                "evaluation excluded",
            }
        )
    return rows


def figures_row() -> dict:
    """Wall time of ``python -m analyses.paper`` into a temporary folder (skipped if it is missing)."""
    row = {
        "row": "regenerate all paper figures (python -m analyses.paper)",
        "ours_s": None,
        "baseline_s": None,
        "baseline": "",
        "ratio": None,
    }
    if not (ROOT / "analyses" / "paper.py").is_file():
        return {**row, "note": "skipped: analyses/paper.py does not exist yet"}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "analyses.paper", "--out", tmp],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {**row, "note": f"failed after {seconds:.0f} s (exit {proc.returncode}): {last}"}
    return {**row, "ours_s": seconds, "note": f"{seconds:.0f} s, every figure, PNG + PDF + JSON"}


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman rank correlation of two score lists (average ranks for ties)."""

    def ranks(x):
        x = torch.tensor(x, dtype=torch.float64)
        order = x.argsort()
        r = torch.empty_like(x)
        r[order] = torch.arange(len(x), dtype=torch.float64)
        for v in x.unique():  # ties share their mean rank
            r[x == v] = r[x == v].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    return torch.corrcoef(torch.stack([ra, rb]))[0, 1].item()


def _timed(fn):
    start = time.perf_counter()
    return fn(), time.perf_counter() - start


@torch.no_grad()
def circuit_speed_rows(n_contexts: int, seed: int = 0) -> list[dict]:
    """``models.interp.circuit`` against the implementation it replaced (``bench.circuit_reference``), on the
    shipped standard GPT-2 as ``analyses.circuit`` runs it (its contexts, its corruption): exact patching of
    every edge, and the keep-only runs of its faithfulness curve; time and the largest difference."""
    subject = load_subject("standard")
    graph = build_graph(subject)
    tokens, _ = subject.task.sample(n_contexts, torch.Generator().manual_seed(seed))  # as analyses.circuit
    runner = Runner(subject, graph, tokens, source_writes(subject, graph, tokens, "demonstrations", seed))
    where = f"standard GPT-2, {len(graph.edges)} edges, {n_contexts} contexts"
    new, new_s = _timed(lambda: exact_scores(runner))
    old, old_s = _timed(lambda: exact_values_per_edge(runner, graph.edges))
    circuits = [top_n(new.means(), n) for n in curve_sizes(len(graph.edges), CIRCUIT_CURVE_POINTS)]
    kept, kept_s = _timed(lambda: torch.stack([runner.keep_only_values(c) for c in circuits]))
    kept_old, kept_old_s = _timed(lambda: torch.stack([keep_only_values_per_receiver(runner, c) for c in circuits]))
    return [
        {"row": f"circuit, exact edge patching of every edge ({where})", "ours_s": new_s, "baseline_s": old_s,
         "baseline": f"one capture and one patch copy per edge, 16 edges ({16 * n_contexts} contexts) a pass", "ratio": old_s / new_s,
         "note": f"largest difference {(new.values - old).abs().max().item():.1e} nats (per context)"},
        {"row": f"circuit, {len(circuits)} keep-only runs of the faithfulness curve ({where})", "ours_s": kept_s,
         "baseline_s": kept_old_s, "baseline": "a full pass per level and one copy per receiver",
         "ratio": kept_old_s / kept_s, "note": f"largest difference {(kept - kept_old).abs().max().item():.1e} nats"},
    ]  # fmt: skip


@torch.no_grad()
def circuit_rows(n_contexts: int, seed: int = 0) -> list[dict]:
    """``models.interp.circuit`` on the shipped standard GPT-2 (``analyses.circuit``'s default corruption: the
    demonstrations from another tree): exact edge patching against EAP and EAP-IG (8 and 32 steps), time,
    the Spearman correlation of each one's edge scores with the exact ones (signed and of |score|), and the
    share of the progress that each one's top tenth of the edges keeps (faithfulness, as analyses.circuit)."""
    subject = load_subject("standard")
    graph = build_graph(subject)
    task = subject.task
    tokens, _ = task.sample(n_contexts, torch.Generator().manual_seed(seed))
    runner = Runner(subject, graph, tokens, source_writes(subject, graph, tokens, "demonstrations", seed))
    plateau = bma_predictive(task.pi, tokens, task.n_examples, task.seq_len, task.root, demonstrations=[], log=True)
    plateau = per_context_nll(plateau, tokens)
    n_kept = len(graph.edges) // 10
    timed = {}
    for name, score in (
        ("exact", lambda: exact_scores(runner).means()),
        ("EAP", lambda: eap_scores(runner).means()),
        ("EAP-IG (8 steps)", lambda: eap_ig_scores(runner, steps=8).means()),
        ("EAP-IG (32 steps)", lambda: eap_ig_scores(runner, steps=32).means()),
    ):
        timed[name] = _timed(score)

    def kept(scores) -> str:
        values = runner.keep_only_values(top_n(scores, n_kept))
        share, se = ratio_se(plateau - values, plateau - runner.clean_values)
        return f"{share:.2f} +- {se:.2f}"

    def pair(a: dict, b: dict, f=float) -> tuple[list, list]:
        """``f`` of the scores of every edge, in the graph's order: by ``a`` and by ``b``."""
        return [f(a[e]) for e in graph.edges], [f(b[e]) for e in graph.edges]

    exact, exact_s = timed["exact"]
    return [
        {
            "row": f"circuit edge scores, {name} vs exact patching (standard GPT-2, {len(graph.edges)} edges, "
            f"{n_contexts} contexts)",
            "ours_s": seconds,
            "baseline_s": exact_s,
            "baseline": "exact path patching",
            "ratio": exact_s / seconds,
            "note": f"Spearman {spearman(*pair(scores, exact)):.3f} with the exact scores, "
            f"{spearman(*pair(scores, exact, abs)):.3f} of abs(score) (the order the search uses); "
            f"its top {n_kept} edges keep {kept(scores)} of the progress (exact's: {kept(exact)})",
        }
        for name, (scores, seconds) in timed.items()
        if name != "exact"
    ]


def circuit_scale_row(n_contexts: int | None = None, n_held_out: int | None = None) -> dict:
    """``discover`` with the default flags (or the sizes given), on a GPT-2-small-shaped model (12 layers, 12
    heads, width 768, the 50,257-token vocabulary: the shipped GPT-2 placed in it by ``bench.deepened``, so
    that it has a circuit to find) against the shipped 2-layer GPT-2: CPU time, and the level each took (the
    big graph's circuit chosen as nodes, one exact run per node being beyond the budget)."""
    sizes = {k: v for k, v in (("n_contexts", n_contexts), ("n_held_out", n_held_out)) if v is not None}
    config = CircuitConfig(**sizes, **({"curve_points": 2} if sizes else {}))
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        big = load_subject(str(deepen(STANDARD_CHECKPOINT, Path(tmp) / "gpt2_small_shape")))
        for name, subject in (("big", big), ("small", load_subject("standard"))):
            cpu = time.process_time()
            r = discover(subject, config)
            found[name] = (r, time.process_time() - cpu)
    (big_r, big_s), (small_r, small_s) = found["big"], found["small"]
    return {
        "row": f"circuit, GPT-2-small shape ({big_r.n_edges_total} edges) vs the shipped GPT-2 "
        f"({small_r.n_edges_total}), CPU seconds, "
        + (f"{n_contexts} search and {n_held_out} held-out contexts" if sizes else "default flags"),
        "ours_s": big_s,
        "baseline_s": small_s,
        "baseline": "the shipped 2-layer GPT-2",
        "ratio": small_s / big_s,
        "note": f"a circuit of {big_r.level} on the big graph; nodes "
        f"{', '.join(map(str, big_r.nodes))} (shipped: {', '.join(map(str, small_r.nodes))}); held-out "
        f"faithfulness {big_r.faithfulness.value:.3f} +- {big_r.faithfulness.se:.3f} on {big_r.n_held_out} contexts "
        f"(shipped {small_r.faithfulness.value:.3f} +- {small_r.faithfulness.se:.3f})",
    }


def table(rows: list[dict]) -> str:
    """A Markdown table: ours, the baseline, baseline / ours (> 1: we are faster)."""

    def fmt(s):
        return "" if s is None else f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"

    lines = ["| measurement | ours | baseline | ratio | note |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        base = f"{fmt(r['baseline_s'])} ({r['baseline']})" if r["baseline_s"] is not None else r["baseline"]
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.1f}x"
        lines.append(f"| {r['row']} | {fmt(r['ours_s'])} | {base} | {ratio} | {r['note']} |")
    return "\n".join(lines)
