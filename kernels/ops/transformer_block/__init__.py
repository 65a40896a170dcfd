"""A pre-norm transformer block (attention + GELU MLP), sharded by logical-axis rules."""
