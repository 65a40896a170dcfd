"""Work over several devices: meshes, logical-axis rules and the interconnect roof (meshes,
which the sharded operations build on), and collectives measured as nccl-tests measures them
(collectives). Imports the core only; jax.distributed's runner and scaling against one device
live with the tools (kernels.testing.distributed, kernels.bench.scaling).
"""
