"""Shared machinery for the raw CUDA kernels: nvcc build cache (build.py), ctypes loading and
launch checks (runtime.py), common device helpers (common.cuh). The kernels themselves live
beside their operations (kernels/ops/<op>/*.cu)."""
