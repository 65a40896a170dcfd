"""Compile guards: an implementation's optimized HLO against its declared rules (hlo), no
recompilation for new values of the same shapes (recompilation), and peak device memory,
compiled and live (memory). Imports the core; reaches operations through the registry.
"""
