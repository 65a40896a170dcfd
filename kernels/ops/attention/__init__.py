"""Scaled dot-product attention softmax(Q K^T * scale + mask) V, (batch, seq, heads, head_dim)."""
