"""Mixture of experts: top-k routing with a capacity, experts sharded over an expert axis."""
