"""jax.vmap of a per-example function over a batch sharded across devices."""
