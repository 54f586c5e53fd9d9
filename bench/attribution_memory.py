"""How much memory attribution patching holds a search context: the peak RSS of ``eap_scores`` and
``eap_ig_scores`` (2 steps) on the shipped GPT-2 at two numbers of search contexts, each in a fresh process, and
its slope per context against the hooked activations of one pass (``context_bytes``): what
``models.interp.circuit.discovery.ATTRIBUTION_PASSES`` rounds up.

    python -m bench.attribution_memory            # 128 and 512 contexts

Imported by nothing. Peak RSS includes the process's own start, so only the slope between the two sizes counts.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

ONE = """
import json, resource, sys, torch
torch.set_num_threads(1)
import models
from models.interp.circuit import discovery
from models.interp.circuit.attribution import eap_ig_scores, eap_scores
from models.interp.circuit.config import CircuitConfig
n, method = int(sys.argv[1]), sys.argv[2]
subject = models.load_subject("standard")
run = discovery._Discovery(subject, CircuitConfig(n_contexts=n, level="edges", corruptions=("demonstrations",), method=method))
run.level()
runner = run.build_runners()["demonstrations"]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
eap_scores(runner) if method == "eap" else eap_ig_scores(runner, steps=2)
rise = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
print(json.dumps({"rise": rise, "hooked": discovery.context_bytes(subject, run.graph)[1]}))
"""


def measure(n: int, method: str) -> dict:
    """The peak-RSS rise (bytes) of one attribution run on ``n`` search contexts, in a fresh process."""
    out = subprocess.run([sys.executable, "-c", ONE, str(n), method], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    sizes = (128, 512)
    for method in ("eap", "eap-ig"):
        small, big = (measure(n, method) for n in sizes)
        slope = (big["rise"] - small["rise"]) / (sizes[1] - sizes[0])
        print(f"{method}: {slope / 2**20:.2f} MB a context against {big['hooked'] / 2**20:.2f} MB hooked: "
              f"{slope / big['hooked']:.1f} passes (peak RSS rise {small['rise'] / 2**20:.0f} and "
              f"{big['rise'] / 2**20:.0f} MB at {sizes[0]} and {sizes[1]} contexts; max RSS of this process "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)")


if __name__ == "__main__":
    main()
