"""Benchmark the suite side by side, in one run, on this machine: ``python -m bench``.

    python -m bench                       # every row but the GPT-2-small ones (about 3 minutes on 2 cores, plus the figures)
    python -m bench --only scale          # inspect on a GPT-2-small shape beside the shipped GPT-2
    python -m bench --only circuit-scale  # the circuit on a GPT-2-small shape beside the shipped GPT-2
    python -m bench --quick               # small sizes, one repeat: a smoke run in seconds
    python -m bench --only step cache     # a subset: step cache bma memory train large figures circuit scale circuit-scale
    python -m bench --device cuda         # time on the GPU (memory row: torch.cuda peak allocation)

Rows: a training step of our model against ``bench.reference`` (the full ((L+1)H)^2 copyer score
matrix per head) at three sizes; ``run_with_cache`` against a plain forward; the vectorised BMA
posterior against a per-context loop; the peak memory of a cached forward at L=K=64, H=32, batch 256;
training steps per second at the default config; the large preset's time to the training targets against
the recipe it replaced; the time to regenerate every paper figure; on the shipped standard GPT-2,
``models.interp.circuit``'s exact edge patching and keep-only runs against the implementation they replaced
(``bench.circuit_reference``, about 3 minutes), and exact edge patching against EAP and EAP-IG (time, and
the Spearman rank correlation of their edge scores with the exact ones). Each time is the median of a few
repeats after a warm-up (the circuit rows: one run); ``scale`` (``bench.scale``, about 10 minutes on a
quiet core): ``analyses.inspect`` with its default flags on a GPT-2-small-shaped model beside the same on the
shipped GPT-2, wall and CPU time and peak memory of each process; ``circuit-scale``: ``discover`` with the default flags
(small sizes with --quick) on a GPT-2-small shape (``bench.deepened``) beside the shipped GPT-2, CPU time. It measures; it asserts nothing about speed.
"""

from __future__ import annotations

import argparse

from models import cli
from models.loading.named import DEFAULT_CHECKPOINT, STANDARD_CHECKPOINT

ROWS = ("step", "cache", "bma", "memory", "train", "large", "figures", "circuit", "scale", "circuit-scale")
DEFAULT_ROWS = ROWS[:-2]  # the GPT-2-small rows (minutes each) run when named: --only scale circuit-scale


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, checked before any work (``models.cli``: threads, device, a ``--json`` in an existing
    writable folder that is none of the checkpoints the rows read)."""
    parser = cli.parser("python -m bench", __doc__)
    parser.add_argument("--only", nargs="+", choices=ROWS,
                        help=f"measure only these rows (default: all of {DEFAULT_ROWS}; scale and circuit-scale only when named)")  # fmt: skip
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: small size only, one repeat, 50 training steps, no memory or figures rows",
    )
    parser.add_argument("--device", default="cpu", help="torch device for the model timings (default: cpu)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    cli.add_json_flags(parser, "the rows, the machine and the command")
    args = parser.parse_args(argv)
    cli.check_run_flags(parser, args, argv, reads=(DEFAULT_CHECKPOINT, STANDARD_CHECKPOINT))
    return args


def main(argv: list[str] | None = None) -> None:
    cli.run_cli(_main, argv, "python -m bench")


def _main(argv: list[str]) -> None:
    args = parse_args(argv)
    from bench.rows import (  # torch loads here, once the flags are parsed
        CIRCUIT_CONTEXTS,
        SIZES,
        bma_row,
        cache_rows,
        circuit_rows,
        circuit_scale_row,
        circuit_speed_rows,
        figures_row,
        large_rows,
        machine,
        memory_row,
        step_rows,
        table,
        train_row,
    )

    only = set(args.only or (DEFAULT_ROWS if not args.quick else ("step", "cache", "bma", "train")))
    repeat = 1 if args.quick else 3
    print(f"machine: {machine(args.device)}", flush=True)
    rows: list[dict] = []
    if "step" in only:
        rows += step_rows(SIZES[:1] if args.quick else SIZES, repeat, args.device)
    if "cache" in only:
        rows += cache_rows(repeat, args.device)
    if "bma" in only:
        rows.append(bma_row(repeat))
    if "memory" in only:
        rows.append(memory_row(args.device))
    if "train" in only:
        rows.append(train_row(args.device, 50 if args.quick else 500))
    if "large" in only:
        rows += large_rows(args.device, 3 if args.quick else 8, 1 if args.quick else 2)
    if "figures" in only:
        rows.append(figures_row())
    if "circuit" in only:
        rows += circuit_speed_rows(16 if args.quick else CIRCUIT_CONTEXTS)
        rows += circuit_rows(8 if args.quick else 32)
    if "scale" in only:
        from bench.scale import scale_rows

        rows += scale_rows(args.device, args.threads, args.quick)
    if "circuit-scale" in only:
        rows.append(circuit_scale_row(*((8, 16) if args.quick else ())))
    print(table(rows))
    if args.json:
        record = {
            "command": args.command,
            "machine": machine(args.device),
            "rows": rows,
        }
        cli.write_json_output(args, record, "python -m bench")


if __name__ == "__main__":
    main()
