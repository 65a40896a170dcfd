// C = A @ B in float32 on CUDA cores (FFMA; no TF32), A: M x K, B: K x N, C: M x N, all
// row-major. Launched from kernels/ops/matmul/cuda_sgemm.py.
//
// Versions:
//   kernelperf_sgemm_128x128x8<VEC>  shared-memory tiling with register blocking: a block of 256
//       threads computes a 128 x 128 tile of C, walking K in steps of 8. Each thread owns 8 x 8
//       outputs, as a 2 x 2 grid of 4 x 4 blocks spaced 64 apart (rows ty*4 and 64 + ty*4, columns
//       tx*4 and 64 + tx*4), so its operands are four float4 reads from shared memory per k and a
//       warp's reads are broadcasts or contiguous (no bank conflicts). A is stored transposed
//       (As[k][m]) for those float4 reads. Two shared-memory buffers: the next K-step's tiles are
//       loaded from global memory into registers while the current one is multiplied, then
//       stored to the other buffer; one barrier per K-step.
//       VEC = true: 16-byte global loads and stores, for K % 4 == 0 and N % 4 == 0 with 16-byte
//       aligned pointers; VEC = false: single floats. Both zero-fill loads past M, N or K and
//       guard every store, so any shape works.

#include "common.cuh"

namespace {
constexpr int BM = 128;
constexpr int BN = 128;
constexpr int BK = 8;
constexpr int THREADS = 256;
constexpr int HALF = 64;  // offset of a thread's second 4-row (4-column) block
}  // namespace

// ----------------------------------------------------------------------------------------------
// Kernels

template <bool VEC>
__global__ void __launch_bounds__(THREADS, 2)
    kernelperf_sgemm_128x128x8(const float* __restrict__ A, const float* __restrict__ B,
                               float* __restrict__ C, int M, int N, int K) {
  __shared__ __align__(16) float As[2][BK][BM];
  __shared__ __align__(16) float Bs[2][BK][BN];

  const int tid = threadIdx.x;
  const int tx = tid % 16;  // output columns tx*4 + {0..3} and 64 + tx*4 + {0..3}
  const int ty = tid / 16;  // output rows    ty*4 + {0..3} and 64 + ty*4 + {0..3}
  const int block_m = blockIdx.y * BM;
  const int block_n = blockIdx.x * BN;

  // Loader roles. A: 128 rows x 8 k, each thread 4 consecutive k of one row; consecutive
  // threads take consecutive rows, so the transposed stores As[k][row] hit distinct banks.
  // B: 8 k x 128 columns, each thread 4 consecutive columns of one k.
  const int a_row = tid % BM;
  const int a_k = (tid / BM) * 4;
  const int b_k = tid / (BN / 4);
  const int b_col = (tid % (BN / 4)) * 4;
  float a_next[4];
  float b_next[4];

  auto load_global = [&](int k0) {
    const int row = block_m + a_row;
    const int ka = k0 + a_k;
    if constexpr (VEC) {
      // K % 4 == 0: the four k are all in range or all out.
      if (row < M && ka < K) {
        const float4 v = *reinterpret_cast<const float4*>(A + static_cast<size_t>(row) * K + ka);
        a_next[0] = v.x; a_next[1] = v.y; a_next[2] = v.z; a_next[3] = v.w;
      } else {
        a_next[0] = a_next[1] = a_next[2] = a_next[3] = 0.f;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a_next[i] = row < M && ka + i < K ? A[static_cast<size_t>(row) * K + ka + i] : 0.f;
      }
    }
    const int kb = k0 + b_k;
    const int col = block_n + b_col;
    if constexpr (VEC) {
      if (kb < K && col < N) {
        const float4 v = *reinterpret_cast<const float4*>(B + static_cast<size_t>(kb) * N + col);
        b_next[0] = v.x; b_next[1] = v.y; b_next[2] = v.z; b_next[3] = v.w;
      } else {
        b_next[0] = b_next[1] = b_next[2] = b_next[3] = 0.f;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        b_next[i] = kb < K && col + i < N ? B[static_cast<size_t>(kb) * N + col + i] : 0.f;
      }
    }
  };
  auto store_shared = [&](int buf) {
#pragma unroll
    for (int i = 0; i < 4; ++i) As[buf][a_k + i][a_row] = a_next[i];
    *reinterpret_cast<float4*>(&Bs[buf][b_k][b_col]) =
        make_float4(b_next[0], b_next[1], b_next[2], b_next[3]);
  };

  float acc[8][8] = {};
  load_global(0);
  store_shared(0);
  __syncthreads();

  const int k_steps = static_cast<int>(kp::ceil_div(K, BK));
  for (int step = 0; step < k_steps; ++step) {
    const int buf = step & 1;
    const bool more = step + 1 < k_steps;
    if (more) load_global((step + 1) * BK);  // in flight while this step multiplies
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      const float4 a_lo = *reinterpret_cast<const float4*>(&As[buf][k][ty * 4]);
      const float4 a_hi = *reinterpret_cast<const float4*>(&As[buf][k][HALF + ty * 4]);
      const float4 b_lo = *reinterpret_cast<const float4*>(&Bs[buf][k][tx * 4]);
      const float4 b_hi = *reinterpret_cast<const float4*>(&Bs[buf][k][HALF + tx * 4]);
      const float a[8] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w, a_hi.x, a_hi.y, a_hi.z, a_hi.w};
      const float b[8] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
      }
    }
    // The other buffer was last read in the previous step, before that step's barrier.
    if (more) store_shared(buf ^ 1);
    __syncthreads();
  }

  // Epilogue: rows ty*4 + i (i < 4) and 64 + ty*4 + (i - 4); columns likewise with tx.
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = block_m + (i < 4 ? ty * 4 + i : HALF + ty * 4 + (i - 4));
    if (row >= M) continue;
    float* c_row = C + static_cast<size_t>(row) * N;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int col = block_n + half * HALF + tx * 4;
      const float* v = &acc[i][half * 4];
      if constexpr (VEC) {
        if (col < N) *reinterpret_cast<float4*>(c_row + col) = make_float4(v[0], v[1], v[2], v[3]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (col + j < N) c_row[col + j] = v[j];
        }
      }
    }
  }
}

// ----------------------------------------------------------------------------------------------
// Launchers

// C = A @ B, float32 row-major. vec: K % 4 == 0, N % 4 == 0 and 16-byte aligned pointers.
KP_EXPORT int kernelperf_sgemm(const float* A, const float* B, float* C, int M, int N, int K,
                               int vec, void* stream) {
  if (M < 1 || N < 1 || K < 1) return cudaErrorInvalidValue;
  if (vec && (K % 4 != 0 || N % 4 != 0)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(kp::ceil_div(N, BN)),
                  static_cast<unsigned>(kp::ceil_div(M, BM)));
  if (grid.y > 65535) return cudaErrorInvalidValue;
  const auto s = static_cast<cudaStream_t>(stream);
  if (vec) {
    kernelperf_sgemm_128x128x8<true><<<grid, THREADS, 0, s>>>(A, B, C, M, N, K);
  } else {
    kernelperf_sgemm_128x128x8<false><<<grid, THREADS, 0, s>>>(A, B, C, M, N, K);
  }
  return cudaGetLastError();
}
