"""The figure and the numbers of docs/explanation/roles.md: ``models.nets.role_heads``'s constructed heads, what
``analyses.inspect`` names each (``models.interp.inspection.inspect_subject``, 64 contexts, seed 0), and one
context's attention pattern of each.

    python docs/scripts/roles_figure.py            # writes docs/explanation/roles.png, prints the roles
    python docs/scripts/roles_figure.py --out DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from models.interp.inspection import inspect_subject  # noqa: E402
from models.interp.subject import subject_of  # noqa: E402
from models.nets.role_heads import ROLES, role_heads_model  # noqa: E402
from probes import MarkovTreeTask  # noqa: E402

HEADS = ["L0H0", "L0H1", "L0H2", "L0H3", "L1H0", "L1H1"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python docs/scripts/roles_figure.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "explanation"))
    out = Path(p.parse_args(argv).out)
    torch.set_num_threads(1)
    task = MarkovTreeTask.random(5, 3, 5, seed=0)
    subject = subject_of(role_heads_model(task), task, None, "role_heads", "0")
    r = inspect_subject(subject, n_contexts=64, seed=0)
    for label in HEADS:
        print(f"{label} (built as {ROLES.get(label, 'uniform')}): {r['roles'][label]}")
    print("sequence heads:", r["sequence_heads"])
    tokens, _ = task.sample(1, torch.Generator().manual_seed(0))
    patterns = [a.pattern[0].double() for a in subject.attention(tokens)]
    fig, axes = plt.subplots(2, 3, figsize=(10.5, 8.4), constrained_layout=True)
    fig.get_layout_engine().set(h_pad=0.2)  # the top row's axis labels clear of the bottom row's titles
    T = patterns[0].shape[-1]
    for ax, label in zip(axes.flat, HEADS):
        layer, head = int(label[1]), int(label[3])
        ax.imshow(patterns[layer][head].numpy(), cmap="Blues", vmin=0, vmax=1)
        role = r["roles"][label]
        ax.set_title(f"{label}: built as {ROLES.get(label, 'uniform')}\n{role.split(' [')[0].split(' (')[0]}",
                     fontsize=9)  # fmt: skip
        ax.set_xticks(range(0, T, 5))
        ax.set_yticks(range(0, T, 5))
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
    fig.suptitle("One context's attention (3 demonstrations of 5 tokens and the target) and the role inspect names",
                 fontsize=11)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "roles.png", dpi=110)
    print(f"wrote {out / 'roles.png'}")


if __name__ == "__main__":
    main()
