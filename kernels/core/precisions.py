"""The arithmetic a matrix product runs in, named as rows, ratios and tolerances name it.

float32 inputs are multiplied in FP32 (IEEE float32 products), TF32 (the tensor cores' float32
mode: operands rounded to 10 mantissa bits, float32 accumulation) or BF16x3 (each operand split
into two bfloat16 pieces, three bfloat16 products summed in float32). 16-bit inputs are
multiplied in their own dtype with float32 accumulation by every implementation here: the
product of two bf16 or two f16 values is exact in float32, so whether a framework multiplies
them on tensor cores or upcast to float32 makes no difference to the product (BF16, FP16).

An implementation whose operation has matrix products declares a `DotPrecision`: what its
float32 path runs in on a GPU and elsewhere (XLA:CPU, the Pallas and Triton interpreters).
`resolve` turns it into the one name of a (case dtype, platform).
"""

from __future__ import annotations

import dataclasses

FP32 = "FP32"
TF32 = "TF32"
BF16X3 = "BF16x3"
# What float32 inputs may be multiplied in.
FLOAT32_PATHS = (FP32, TF32, BF16X3)
# The precision of a case computed in its own dtype (16-bit: with float32 accumulation).
OF_DTYPE = {"f64": "FP64", "f32": FP32, "bf16": "BF16", "f16": "FP16"}
NAMES = (*FLOAT32_PATHS, *(name for name in OF_DTYPE.values() if name != FP32))

# Relative rounding of a float32 operand by each float32 path, beyond float32's own: TF32 keeps
# 10 of float32's 23 mantissa bits (rounded to nearest: 2^-11); BF16x3's two bfloat16 pieces
# keep about 16 bits (2^-17), the dropped low x low product adding 2^-18 at most. Tolerances
# take it as `rounding` (Operation.tolerance): each product rounds two operands, so its error
# is about 2 x this. METHOD.md's measured errors: float32 far under 1e-3, TF32 near 3e-4.
ROUNDING = {FP32: 0.0, TF32: 2.0 ** -11, BF16X3: 2.0 ** -17}


def _check_path(name: str, value: str | None) -> None:
    if value is not None and value not in FLOAT32_PATHS:
        raise ValueError(f"precision.{name}: expected one of {FLOAT32_PATHS} or None (no "
                         f"float32 inputs), got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DotPrecision:
    """What an implementation's matrix products multiply float32 inputs in.

    gpu: on a CUDA GPU; cpu: elsewhere (XLA:CPU, Pallas interpret mode, Triton's
        interpreter). Each one of FLOAT32_PATHS, or None where the implementation takes no
        float32 input (its `supports` refuses f32 cases).
    Declared for sm_80+ GPUs (Ampere on), the GPUs whose tensor cores have TF32; on an older
    one a TF32 declaration computes in FP32 in fact (XLA, cuBLAS and Triton fall back), which
    only makes its check stricter than needed.
    """

    gpu: str | None
    cpu: str | None

    def __post_init__(self) -> None:
        _check_path("gpu", self.gpu)
        _check_path("cpu", self.cpu)

    def on(self, platform: str) -> str | None:
        if platform not in ("gpu", "cpu"):
            raise ValueError(f"platform: expected 'gpu' or 'cpu', got {platform!r}")
        return self.gpu if platform == "gpu" else self.cpu


# Full float32 everywhere: FFMA kernels, Triton input_precision="ieee", XLA Precision.HIGHEST,
# torch.matmul with TF32 off (its default).
EVERYWHERE_FP32 = DotPrecision(gpu=FP32, cpu=FP32)
# XLA's default dot precision and Triton's default tl.dot: TF32 on an Ampere+ GPU, FP32 on the
# CPU (XLA:CPU has no TF32; Triton's interpreter multiplies in NumPy float32 whatever
# input_precision says, triton/runtime/interpreter.py create_dot).
TF32_ON_GPU = DotPrecision(gpu=TF32, cpu=FP32)
# bf16/f16 inputs only (wgmma, mma.sync, cuDNN and flash attention kernels).
NO_FLOAT32 = DotPrecision(gpu=None, cpu=None)


def resolve(declared: DotPrecision | None, dtype: str, platform: str, *,
            label: str = "implementation") -> str:
    """The precision a case in `dtype` computes in on `platform` ("gpu" or "cpu").

    16-bit (and float64) cases: their dtype's. float32: the declaration's path on that
    platform; FP32 where nothing is declared (an operation without matrix products computes
    float32 in float32). ValueError where the declaration says there is no float32 path.
    """
    if dtype not in OF_DTYPE:
        raise ValueError(f"dtype: expected one of {sorted(OF_DTYPE)}, got {dtype!r}")
    if dtype != "f32":
        return OF_DTYPE[dtype]
    if declared is None:
        return FP32
    path = declared.on(platform)
    if path is None:
        raise ValueError(f"{label}: declares no float32 path (precision {declared}), yet runs "
                         f"an f32 case on {platform}")
    return path


def rounding(precision: str, dtype: str) -> float:
    """Operand rounding beyond `dtype`'s own that `precision` adds (0 for a case computed in
    its own dtype)."""
    if precision not in NAMES:
        raise ValueError(f"precision: expected one of {NAMES}, got {precision!r}")
    if precision == OF_DTYPE.get(dtype):
        return 0.0
    if dtype != "f32" or precision not in ROUNDING:
        raise ValueError(f"precision: a {dtype} case computes in {OF_DTYPE.get(dtype)}"
                         f"{' or one of ' + str(FLOAT32_PATHS) if dtype == 'f32' else ''}, "
                         f"got {precision!r}")
    return ROUNDING[precision]
