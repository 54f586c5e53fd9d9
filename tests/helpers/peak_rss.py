"""``python -m peak_rss OUT MODULE ARGV...``: run ``python -m MODULE ARGV`` in this process, then write to the
file OUT how far its peak resident memory rose above what it was before MODULE started (KiB, from
``resource.getrusage``'s ``ru_maxrss``). Run through ``forked.run``, the baseline already holds the imports, so
OUT is what the command itself took at its peak; its exit code, stdout and stderr are the command's."""

from __future__ import annotations

import resource
import runpy
import sys
from pathlib import Path


def peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


if __name__ == "__main__":
    out, module, *argv = sys.argv[1:]
    before = peak_kib()
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        Path(out).write_text(str(peak_kib() - before))
