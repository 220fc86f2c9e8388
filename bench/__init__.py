"""Benchmarks of the jobs engine (``python bench/run.py``); never part of pytest."""
