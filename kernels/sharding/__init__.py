"""Work over several devices: meshes, logical-axis rules and interconnect bandwidth (meshes,
which the sharded operations build on), every sharded operation over jax.distributed's
processes (distributed), and scaling against one device (scaling). Imports the core; reaches
operations through the registry, never by importing them.
"""
