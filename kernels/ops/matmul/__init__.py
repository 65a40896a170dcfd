"""Matrix product C = A @ B."""
