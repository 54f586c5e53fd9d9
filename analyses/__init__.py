"""Runnable experiments: python -m analyses.<name>."""

import models  # noqa: F401  (first: `python -m analyses.<name> --help` answers there, before torch loads)
