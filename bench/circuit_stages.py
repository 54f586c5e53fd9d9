"""Where a circuit discovery's time goes: ``discover`` with the command line's defaults (or the flags given)
on a model, each stage's wall and CPU seconds and its share of the wall time, and the JSON beside it.

    python -m bench.circuit_stages                        # the shipped GPT-2, default flags
    python -m bench.circuit_stages --checkpoint DIR --out runs/stages.json

Imported by nothing. The stages are ``CircuitResult.timings``; the load average is printed with them,
since on a shared machine wall time follows the load and CPU time much less.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from models import load_subject
from models.interp.circuit import CircuitConfig, discover
from models.training.optim import keep_freed_memory


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.circuit_stages", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default="standard")
    p.add_argument("--n-contexts", type=int, default=CircuitConfig.n_contexts)
    p.add_argument("--n-held-out", type=int, default=None)
    p.add_argument("--curve-points", type=int, default=CircuitConfig.curve_points)
    p.add_argument("--exact-budget", type=float, default=CircuitConfig.exact_budget)
    p.add_argument("--out", default=None, help="write the result's JSON here")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    keep_freed_memory()  # as analyses.circuit does
    load = os.getloadavg()[0]
    wall, cpu = time.perf_counter(), time.process_time()
    r = discover(load_subject(a.checkpoint), CircuitConfig(n_contexts=a.n_contexts, n_held_out=a.n_held_out,
                                                           curve_points=a.curve_points, exact_budget=a.exact_budget))  # fmt: skip
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(
        f"{a.checkpoint}: discover {wall:.0f} s wall, {cpu:.0f} s CPU (load {load:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end); {len(r.edges)} edges, nodes {', '.join(map(str, r.nodes))}"
    )
    print("| stage | wall s | CPU s | share of wall |\n|---|---:|---:|---:|")
    for stage, (w, c) in r.timings.items():
        print(f"| {stage} | {w:.1f} | {c:.1f} | {w / wall:.0%} |")
    if a.out:
        Path(a.out).write_text(json.dumps({"results": r.to_dict(), "timings": r.timings}, indent=1))


if __name__ == "__main__":
    main()
