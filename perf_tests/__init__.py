"""asv benchmarks (see benchmarks.py)."""
