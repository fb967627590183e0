"""Benchmarks (not collected by pytest): run with ``python -m tests.bench``."""
