"""kernelperf: a performance regression suite for GPU kernels.

Importing this package is cheap and imports no framework; `kernels.registry`
loads the operations and their implementations on first use.
"""

__version__ = "0.1.0"
