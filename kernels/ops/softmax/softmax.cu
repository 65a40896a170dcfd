// Softmax over the last axis of a (rows, cols) row-major array, f32 / bf16 / f16 in and out,
// float32 arithmetic. Launched from kernels/ops/softmax/cuda.py, which picks the version and
// its shape (SoftmaxConfig).
//
// Versions:
//   kernelperf_softmax_cached  a group of threads per row holds the whole row in registers, so
//                              x is read once and y written once (the fewest bytes):
//                              a warp per row (blockDim = (32, rows per block)) for short rows,
//                              a block per row (blockDim = (threads, 1)) for long ones. Each
//                              thread issues all its VECS loads before the first use.
//   kernelperf_softmax_online  rows too long for registers: one block per row; a first pass
//                              keeps a running max and a sum rescaled whenever the max grows
//                              (Milakov & Gimelshein 2018, "Online normalizer calculation for
//                              softmax"), a second pass re-reads x (mostly from L2) and writes.
// Both take W elements per access: W = 16 / sizeof(T) (16-byte vectors) when x and y are equally
// aligned modulo 16 bytes, else W = 1. With vectors, each row splits into a scalar head up to its
// first 16-byte boundary, the vectors, and a scalar tail; threads 0..W-1 and W..2W-1 of the
// row's group take the head and tail elements (at most one each) beside their vectors.

#include "common.cuh"

// ----------------------------------------------------------------------------------------------
// Kernels

template <typename T, int VECS, int W>
__global__ void __launch_bounds__(1024)
    kernelperf_softmax_cached(const T* __restrict__ x, T* __restrict__ y, long long rows,
                              int cols) {
  __shared__ float scratch[32];
  const long long row = static_cast<long long>(blockIdx.x) * blockDim.y + threadIdx.y;
  // Only whole warps leave here (groups wider than a warp have blockDim.y == 1 and one block per
  // row), and a warp-wide group reduces with shuffles alone, so no barrier is skipped.
  if (row >= rows) return;
  const T* in = x + row * cols;
  T* out = y + row * cols;
  const int group = blockDim.x;
  const int t = threadIdx.x;
  const kp::RowSplit split = kp::split_row<T, W>(in, cols);
  const int extra = kp::split_extra<W>(split, cols, t);

  float v[VECS][W];
  float e = extra >= 0 ? kp::to_float(in[extra]) : -INFINITY;  // exp() of padding is 0
  float row_max = e;
#pragma unroll
  for (int i = 0; i < VECS; ++i) {
    const int vector = i * group + t;
    if (vector < split.vectors) {
      kp::load_floats<T, W>(in + split.head + vector * W, v[i]);
    } else {
#pragma unroll
      for (int j = 0; j < W; ++j) v[i][j] = -INFINITY;
    }
#pragma unroll
    for (int j = 0; j < W; ++j) row_max = fmaxf(row_max, v[i][j]);
  }
  row_max = kp::group_reduce(row_max, kp::MaxOp{}, -INFINITY, scratch);

  e = expf(e - row_max);
  float sum = e;
#pragma unroll
  for (int i = 0; i < VECS; ++i) {
#pragma unroll
    for (int j = 0; j < W; ++j) {
      v[i][j] = expf(v[i][j] - row_max);
      sum += v[i][j];
    }
  }
  const float inv_sum = 1.f / kp::group_reduce(sum, kp::SumOp{}, 0.f, scratch);

  if (extra >= 0) out[extra] = kp::from_float<T>(e * inv_sum);
#pragma unroll
  for (int i = 0; i < VECS; ++i) {
    const int vector = i * group + t;
    if (vector < split.vectors) {
#pragma unroll
      for (int j = 0; j < W; ++j) v[i][j] *= inv_sum;
      kp::store_floats<T, W>(out + split.head + vector * W, v[i]);
    }
  }
}

template <typename T, int W>
__global__ void __launch_bounds__(1024)
    kernelperf_softmax_online(const T* __restrict__ x, T* __restrict__ y, int cols) {
  __shared__ float scratch[32];
  const long long row = blockIdx.x;
  const T* in = x + row * cols;
  T* out = y + row * cols;
  const int t = threadIdx.x;
  const kp::RowSplit split = kp::split_row<T, W>(in, cols);
  const int extra = kp::split_extra<W>(split, cols, t);
  const T* body = in + split.head;

  // Running max m of this thread's elements and sum s of exp(element - m), rescaled whenever
  // m grows; the head/tail element (if any) starts them.
  float m = extra >= 0 ? kp::to_float(in[extra]) : -INFINITY;
  float s = m == -INFINITY ? 0.f : 1.f;
  for (int vector = t; vector < split.vectors; vector += blockDim.x) {
    float v[W];
    kp::load_floats<T, W>(body + static_cast<long long>(vector) * W, v);
    float m_new = m;
#pragma unroll
    for (int j = 0; j < W; ++j) m_new = fmaxf(m_new, v[j]);
    if (m_new == -INFINITY) continue;  // all -inf so far: nothing to add, and no -inf - -inf
    float added = 0.f;
#pragma unroll
    for (int j = 0; j < W; ++j) added += expf(v[j] - m_new);
    s = s * expf(m - m_new) + added;
    m = m_new;
  }
  const float row_max = kp::group_reduce(m, kp::MaxOp{}, -INFINITY, scratch);
  s = m == -INFINITY ? 0.f : s * expf(m - row_max);
  const float inv_sum = 1.f / kp::group_reduce(s, kp::SumOp{}, 0.f, scratch);

  if (extra >= 0) {
    out[extra] = kp::from_float<T>(expf(kp::to_float(in[extra]) - row_max) * inv_sum);
  }
  T* out_body = out + split.head;
  for (int vector = t; vector < split.vectors; vector += blockDim.x) {
    float v[W];
    kp::load_floats<T, W>(body + static_cast<long long>(vector) * W, v);
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = expf(v[j] - row_max) * inv_sum;
    kp::store_floats<T, W>(out_body + static_cast<long long>(vector) * W, v);
  }
}

// ----------------------------------------------------------------------------------------------
// Launchers

namespace {

// Row values one thread may hold in registers (cached version); cuda.py keeps to it.
constexpr int kMaxValuesPerThread = 32;

template <typename T, int W>
cudaError_t launch_cached(const T* x, T* y, long long rows, int cols, dim3 block, int vecs,
                          cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(kp::ceil_div(rows, block.y)));
  switch (vecs) {
    case 1: kernelperf_softmax_cached<T, 1, W><<<grid, block, 0, stream>>>(x, y, rows, cols); break;
    case 2: kernelperf_softmax_cached<T, 2, W><<<grid, block, 0, stream>>>(x, y, rows, cols); break;
    case 4: kernelperf_softmax_cached<T, 4, W><<<grid, block, 0, stream>>>(x, y, rows, cols); break;
    case 8:
      // 8 vectors of 8 bf16/f16 would be 64 floats a thread: past the 64 registers that
      // 1024-thread blocks allow. The config caps those at 4.
      if constexpr (8 * W > kMaxValuesPerThread) {
        return cudaErrorInvalidValue;
      } else {
        kernelperf_softmax_cached<T, 8, W><<<grid, block, 0, stream>>>(x, y, rows, cols);
      }
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch(const void* x_ptr, void* y_ptr, long long rows, int cols, int threads,
                   int rows_per_block, int vecs, bool vectorized, bool online,
                   cudaStream_t stream) {
  const T* x = static_cast<const T*>(x_ptr);
  T* y = static_cast<T*>(y_ptr);
  constexpr int V = kp::kVec16<T>;
  const long long width = vectorized ? V : 1;
  if (online) {
    if (rows_per_block != 1 || rows > 0x7fffffffLL) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(rows)), block(threads);
    if (vectorized) {
      kernelperf_softmax_online<T, V><<<grid, block, 0, stream>>>(x, y, cols);
    } else {
      kernelperf_softmax_online<T, 1><<<grid, block, 0, stream>>>(x, y, cols);
    }
    return cudaGetLastError();
  }
  // The row must fit the registers of its group; groups wider than a warp own a whole block.
  if (static_cast<long long>(threads) * vecs * width < cols) return cudaErrorInvalidValue;
  if (threads > 32 && rows_per_block != 1) return cudaErrorInvalidValue;
  if (kp::ceil_div(rows, rows_per_block) > 0x7fffffffLL) return cudaErrorInvalidValue;
  const dim3 block(threads, rows_per_block);
  return vectorized ? launch_cached<T, V>(x, y, rows, cols, block, vecs, stream)
                    : launch_cached<T, 1>(x, y, rows, cols, block, vecs, stream);
}

}  // namespace

// y = softmax(x) over the last axis; x, y: rows x cols, contiguous, dtype (KpDtype).
// threads: per row (32: a warp per row; up to 1024: a block per row), rows_per_block: warps
// per block when threads == 32 (else 1), vecs: accesses per thread holding the row (cached
// version), vectorized: 16-byte accesses (x and y equally aligned modulo 16 bytes), online:
// the two-pass version for long rows.
KP_EXPORT int kernelperf_softmax(const void* x, void* y, long long rows, int cols, int dtype,
                                 int threads, int rows_per_block, int vecs, int vectorized,
                                 int online, void* stream) {
  if (rows < 1 || cols < 1 || threads < 32 || threads > 1024 || threads % 32 != 0 ||
      rows_per_block < 1 || threads * rows_per_block > 1024) {
    return cudaErrorInvalidValue;
  }
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case KP_F32:
      return launch<float>(x, y, rows, cols, threads, rows_per_block, vecs, vectorized, online, s);
    case KP_BF16:
      return launch<__nv_bfloat16>(x, y, rows, cols, threads, rows_per_block, vecs, vectorized,
                                   online, s);
    case KP_F16:
      return launch<__half>(x, y, rows, cols, threads, rows_per_block, vecs, vectorized, online,
                            s);
    default:
      return cudaErrorInvalidValue;
  }
}
