"""Shared machinery for the raw CUDA kernels: the nvcc build cache (build.py), ctypes loading
and launch checks (runtime.py) and device helpers every .cu includes (common.cuh). The kernels
live beside their operations (kernels/ops/<op>/*.cu, launched by the .py beside them); their
timing against torch/cuBLAS is kernels.profile.cuda_bench. Imports the core only.
"""
