"""Profiling and audit tools, mostly for a GPU: XProf traces and top kernels (profiling),
Nsight Compute bottleneck verdicts (bottleneck), independent cross-checks of the reported
numbers (crosscheck), Triton/Gluon compiled for sm_90 without a GPU (triton_aot), bad inputs
and sanitizer sweeps (gpu_sweep), and the CUDA kernels timed beside torch/cuBLAS
(cuda_bench). Imports the core, guards and operations; never the command line.
"""
