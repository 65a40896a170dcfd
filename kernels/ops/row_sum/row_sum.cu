// Row sum over the last axis of a (rows, cols) row-major array, f32 / bf16 / f16 in and out,
// float32 accumulation. Launched from kernels/ops/row_sum/cuda.py (RowSumConfig).
//
// Versions:
//   kernelperf_row_sum  a group of threads per row: a warp per row (blockDim = (32, rows per
//                       block)) for short rows, a block per row (blockDim = (threads, 1)) for
//                       long ones. Each thread sweeps the row issuing VECS independent loads
//                       per step (W elements each: 16-byte vectors, else single elements) into
//                       VECS float accumulators; the group then reduces through warp shuffles
//                       and, across warps, shared memory. With vectors, each row splits into a
//                       scalar head up to its first 16-byte boundary, the vectors and a scalar
//                       tail, whose elements threads 0..2W-1 add beside their vectors.
// Bandwidth-bound: every element is read once, one value per row is written.

#include "common.cuh"

// ----------------------------------------------------------------------------------------------
// Kernels

template <typename T, int VECS, int W>
__global__ void __launch_bounds__(1024)
    kernelperf_row_sum(const T* __restrict__ x, T* __restrict__ y, long long rows, int cols) {
  __shared__ float scratch[32];
  const long long row = static_cast<long long>(blockIdx.x) * blockDim.y + threadIdx.y;
  // Only whole warps leave here (block-wide groups have blockDim.y == 1 and a block per row),
  // and a warp-wide group reduces with shuffles alone.
  if (row >= rows) return;
  const T* in = x + row * cols;
  const int t = threadIdx.x;
  const kp::RowSplit split = kp::split_row<T, W>(in, cols);
  const int extra = kp::split_extra<W>(split, cols, t);
  const T* body = in + split.head;
  const int group = blockDim.x;

  float acc[VECS] = {};
  acc[0] = extra >= 0 ? kp::to_float(in[extra]) : 0.f;
  for (int base = t; base < split.vectors; base += group * VECS) {
    float v[VECS][W];
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
      const int vector = base + i * group;
      if (vector < split.vectors) {
        kp::load_floats<T, W>(body + static_cast<long long>(vector) * W, v[i]);
      } else {
#pragma unroll
        for (int j = 0; j < W; ++j) v[i][j] = 0.f;
      }
    }
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
#pragma unroll
      for (int j = 0; j < W; ++j) acc[i] += v[i][j];
    }
  }
  float total = 0.f;
#pragma unroll
  for (int i = 0; i < VECS; ++i) total += acc[i];
  total = kp::group_reduce(total, kp::SumOp{}, 0.f, scratch);
  if (t == 0) y[row] = kp::from_float<T>(total);
}

// ----------------------------------------------------------------------------------------------
// Launchers

namespace {

// Values one thread loads per step; cuda.py keeps to it.
constexpr int kMaxValuesPerThread = 32;

template <typename T, int W>
cudaError_t launch_width(const T* x, T* y, long long rows, int cols, dim3 block, int vecs,
                         cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(kp::ceil_div(rows, block.y)));
  switch (vecs) {
    case 1: kernelperf_row_sum<T, 1, W><<<grid, block, 0, stream>>>(x, y, rows, cols); break;
    case 2: kernelperf_row_sum<T, 2, W><<<grid, block, 0, stream>>>(x, y, rows, cols); break;
    case 4: kernelperf_row_sum<T, 4, W><<<grid, block, 0, stream>>>(x, y, rows, cols); break;
    case 8:
      // 8 vectors of 8 bf16/f16 would be 64 floats a thread: past the 64 registers that
      // 1024-thread blocks allow. The config caps those at 4.
      if constexpr (8 * W > kMaxValuesPerThread) {
        return cudaErrorInvalidValue;
      } else {
        kernelperf_row_sum<T, 8, W><<<grid, block, 0, stream>>>(x, y, rows, cols);
      }
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch(const void* x, void* y, long long rows, int cols, dim3 block, int vecs,
                   bool vectorized, cudaStream_t stream) {
  constexpr int V = kp::kVec16<T>;
  const T* in = static_cast<const T*>(x);
  T* out = static_cast<T*>(y);
  return vectorized ? launch_width<T, V>(in, out, rows, cols, block, vecs, stream)
                    : launch_width<T, 1>(in, out, rows, cols, block, vecs, stream);
}

}  // namespace

// y[r] = sum_c x[r, c]; x: rows x cols, y: rows, contiguous, dtype (KpDtype).
// threads: per row (32: a warp per row, with rows_per_block warps a block; up to 1024: a block
// per row, rows_per_block 1), vecs: loads in flight per thread, vectorized: 16-byte loads.
KP_EXPORT int kernelperf_row_sum(const void* x, void* y, long long rows, int cols, int dtype,
                                 int threads, int rows_per_block, int vecs, int vectorized,
                                 void* stream) {
  if (rows < 1 || cols < 1 || threads < 32 || threads > 1024 || threads % 32 != 0 ||
      rows_per_block < 1 || threads * rows_per_block > 1024 ||
      (threads > 32 && rows_per_block != 1) ||
      kp::ceil_div(rows, rows_per_block) > 0x7fffffffLL) {
    return cudaErrorInvalidValue;
  }
  const dim3 block(threads, rows_per_block);
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case KP_F32: return launch<float>(x, y, rows, cols, block, vecs, vectorized, s);
    case KP_BF16: return launch<__nv_bfloat16>(x, y, rows, cols, block, vecs, vectorized, s);
    case KP_F16: return launch<__half>(x, y, rows, cols, block, vecs, vectorized, s);
    default: return cudaErrorInvalidValue;
  }
}
