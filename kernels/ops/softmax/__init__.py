"""Softmax over the last axis."""
