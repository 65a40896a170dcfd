"""Matrix product over a (data, model) device mesh: compiler-partitioned and ring collective."""
