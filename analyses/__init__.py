"""Runnable experiments: python -m analyses.<name>."""
