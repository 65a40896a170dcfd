// Shared by kernelperf's CUDA sources (one translation unit per library, so the
// definitions below appear once in each library):
//   - kernelperf_error_string: the message of a cudaError_t, for the Python side;
//   - dtype codes, which must match kernels/cuda/runtime.py DTYPE_CODES;
//   - float conversion, 16-byte vector loads/stores of f32/bf16/f16, rows split for them;
//   - warp and block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#define KP_EXPORT extern "C" __attribute__((visibility("default")))

KP_EXPORT const char* kernelperf_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

enum KpDtype : int { KP_F32 = 0, KP_BF16 = 1, KP_F16 = 2 };

namespace kp {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// Elements of T in one 16-byte access.
template <typename T> constexpr int kVec16 = 16 / sizeof(T);

// Load W consecutive elements at p (16-byte aligned when W == kVec16<T>) as floats.
template <typename T, int W>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[W]) {
  static_assert(W == 1 || W == kVec16<T>, "W: one element or one 16-byte vector");
  if constexpr (W == 1) {
    out[0] = to_float(*p);
  } else {
    uint4 raw = *reinterpret_cast<const uint4*>(p);
    T elements[W];
    memcpy(elements, &raw, sizeof(raw));
#pragma unroll
    for (int i = 0; i < W; ++i) out[i] = to_float(elements[i]);
  }
}

// Store W floats to p as T (16-byte aligned when W == kVec16<T>), rounding to nearest.
template <typename T, int W>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[W]) {
  static_assert(W == 1 || W == kVec16<T>, "W: one element or one 16-byte vector");
  if constexpr (W == 1) {
    *p = from_float<T>(in[0]);
  } else {
    T elements[W];
#pragma unroll
    for (int i = 0; i < W; ++i) elements[i] = from_float<T>(in[i]);
    uint4 raw;
    memcpy(&raw, elements, sizeof(raw));
    *reinterpret_cast<uint4*>(p) = raw;
  }
}

// A row of n elements at p, split for 16-byte accesses: a scalar head up to the first 16-byte
// boundary, `vectors` whole vectors of W elements, and a scalar tail from `tail` to n. With
// W == 1 everything is "vectors". Rows of x and y split alike when their pointers are equal
// modulo 16 (the launchers check).
struct RowSplit {
  int head;
  int vectors;
  int tail;
};

template <typename T, int W>
__device__ __forceinline__ RowSplit split_row(const T* p, int n) {
  if constexpr (W == 1) {
    return {0, n, n};
  } else {
    const int misaligned = static_cast<int>(reinterpret_cast<uintptr_t>(p) & 15) / sizeof(T);
    const int head = min((W - misaligned) % W, n);
    const int vectors = (n - head) / W;
    return {head, vectors, head + vectors * W};
  }
}

// The element outside the vectors that thread t of a row's group (at least 2W threads) owns,
// or -1: threads 0 .. head-1 take the head, threads W .. W + (n - tail) - 1 the tail.
template <int W>
__device__ __forceinline__ int split_extra(const RowSplit& split, int n, int t) {
  if (t < split.head) return t;
  const int j = t - W;
  return j >= 0 && j < n - split.tail ? split.tail + j : -1;
}

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

template <typename Op>
__device__ __forceinline__ float warp_reduce(float value, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

// Reduce over the threads of a one-dimensional group of blockDim.x threads (a multiple of 32,
// at most 1024): warp shuffles, then one shared-memory exchange between warps when the group
// spans several. Every thread of the block must call it; all get the result. `scratch` holds
// 32 floats; the trailing barrier lets the caller reuse it for the next reduction.
template <typename Op>
__device__ __forceinline__ float group_reduce(float value, Op op, float identity, float* scratch) {
  value = warp_reduce(value, op);
  if (blockDim.x == 32) return value;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : identity;
  value = warp_reduce(value, op);
  __syncthreads();
  return value;
}

__host__ __device__ constexpr long long ceil_div(long long a, long long b) {
  return (a + b - 1) / b;
}

}  // namespace kp
