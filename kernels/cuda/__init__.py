"""Shared machinery for the raw CUDA kernels: the nvcc build cache (build.py), ctypes loading
and launch checks (runtime.py), device helpers every .cu includes (common.cuh), and a timing
command against torch/cuBLAS (bench.py). The kernels live beside their operations
(kernels/ops/<op>/*.cu, launched by the .py beside them)."""
