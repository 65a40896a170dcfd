"""A stack of residual MLP blocks (the feed-forward part of a transformer)."""
