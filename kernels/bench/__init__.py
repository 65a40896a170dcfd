"""Benchmark and gate tooling: the asv environment plugin and helpers (machine names, runs,
the direction-aware compare and its verdicts, noise floors), gate-power's planted slowdowns,
the nightly history of main, the offline dashboard, `asv find` on a planted commit, the
pytest perf checks against floors, and git for all of them. Imports the core, roofline and
the operations through the registry; never the command line.
"""
