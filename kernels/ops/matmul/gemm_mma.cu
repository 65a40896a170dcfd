// C = A @ B for bf16 or f16 on tensor cores, float32 accumulation, output in the input dtype.
// A: M x K, B: K x N, C: M x N, all row-major. Launched from kernels/ops/matmul/cuda_mma.py.
//
// Versions:
//   kernelperf_gemm_mma<T, BM, BN, ALIGNED>  a block of (BM / 64) x (BN / 64) warps computes a
//       BM x BN tile of C (instantiated: 128 x 128 with 4 warps, 128 x 256 with 8), each warp a
//       64 x 64 sub-tile as 4 x 8 tensor-core products mma.sync.m16n8k16 (sm_80+) per 16-wide
//       k slice, accumulators in registers. Operands reach the warps through ldmatrix (.trans
//       for B, which is k-major in memory while the instruction wants it n-major). Shared
//       memory holds STAGES = 4 k-steps of BK = 32; each 16-byte chunk is stored at an
//       XOR-swizzled position (A: chunk ^ (row / 2 % 4), B: chunk ^ (row % 8)) so the 8 rows an
//       ldmatrix reads fall in 8 different bank groups. Blocks are ordered in groups of GROUP_M
//       tile-rows so that neighbouring blocks share A and B tiles in L2 (as in Triton's matmul
//       tutorial).
//       ALIGNED = true (K % 8 == 0, N % 8 == 0, 16-byte aligned A and B): global tiles arrive
//       by cp.async (16 bytes, zero-filled past the matrix edge), STAGES - 1 k-steps ahead of
//       the multiply, with one barrier per k-step. ALIGNED = false: the same pipeline filled by
//       ordinary guarded loads, element by element; any shape works.

#include <type_traits>

#include "common.cuh"

namespace {
constexpr int BK = 32;
constexpr int WM = 64;  // a warp's tile of C: WM x WN
constexpr int WN = 64;
constexpr int MMA_M = 16;
constexpr int MMA_N = 8;
constexpr int MMA_K = 16;
constexpr int FRAG_M = WM / MMA_M;  // 4 products down
constexpr int FRAG_N = WN / MMA_N;  // 8 products across
constexpr int STAGES = 4;
constexpr int CHUNK = 8;                      // elements in a 16-byte chunk
constexpr int A_CHUNKS_PER_ROW = BK / CHUNK;  // 4
constexpr int GROUP_M = 8;
constexpr int REGISTERS_PER_SM = 65536;
constexpr int REGISTERS_PER_THREAD = 255;  // what the accumulators and fragments need

template <int BM_, int BN_>
struct Tile {
  static constexpr int BM = BM_;
  static constexpr int BN = BN_;
  static constexpr int WARPS_M = BM / WM;
  static constexpr int WARPS_N = BN / WN;
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  // Blocks per SM that the register file allows at REGISTERS_PER_THREAD (the launch bound).
  static constexpr int MIN_BLOCKS = REGISTERS_PER_SM / (THREADS * (REGISTERS_PER_THREAD + 1));
  static constexpr int A_STAGE = BM * BK;  // elements
  static constexpr int B_STAGE = BK * BN;
  static constexpr int B_CHUNKS_PER_ROW = BN / CHUNK;
  static constexpr int SMEM_BYTES = STAGES * (A_STAGE + B_STAGE) * 2;  // above the 48 KiB default
  static_assert(BM % WM == 0 && BN % WN == 0, "whole warp tiles");
  static_assert(BM * A_CHUNKS_PER_ROW % THREADS == 0, "A tile chunks split evenly over threads");
  static_assert(BK * B_CHUNKS_PER_ROW % THREADS == 0, "B tile chunks split evenly over threads");
  static_assert(MIN_BLOCKS >= 1, "a block must fit the register file");
};

// Element offsets of 16-byte chunk `chunk` of row `row` in a stage (see the header: swizzles).
__device__ __forceinline__ int a_offset(int row, int chunk) {
  return row * BK + ((chunk ^ ((row >> 1) & 3)) * CHUNK);
}
template <int BN>
__device__ __forceinline__ int b_offset(int row, int chunk) {
  return row * BN + ((chunk ^ (row & 7)) * CHUNK);
}

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; zero-filled (nothing read) when !valid.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

// d += a @ b for one m16n8k16 tile (fragment layouts: PTX ISA, "Matrix Fragments for
// mma.m16n8k16").
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4],
                                          const unsigned (&b)[2]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

template <typename T>
__device__ __forceinline__ void store_pair(T* c, float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    *reinterpret_cast<__nv_bfloat162*>(c) = __floats2bfloat162_rn(lo, hi);
  } else {
    *reinterpret_cast<__half2*>(c) = __floats2half2_rn(lo, hi);
  }
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// Kernels

template <typename T, int BM, int BN, bool ALIGNED>
__global__ void __launch_bounds__(Tile<BM, BN>::THREADS, Tile<BM, BN>::MIN_BLOCKS)
    kernelperf_gemm_mma(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                        int M, int N, int K) {
  using Config = Tile<BM, BN>;
  constexpr int THREADS = Config::THREADS;
  constexpr int WARPS_N = Config::WARPS_N;
  constexpr int A_STAGE = Config::A_STAGE;
  constexpr int B_STAGE = Config::B_STAGE;
  constexpr int B_CHUNKS_PER_ROW = Config::B_CHUNKS_PER_ROW;
  extern __shared__ __align__(128) unsigned char smem[];
  T* As = reinterpret_cast<T*>(smem);
  T* Bs = As + STAGES * A_STAGE;

  // Grouped order: consecutive blocks walk GROUP_M tile-rows down one tile-column, then move
  // right, so the A rows and B columns they read are fresh in L2.
  const int tiles_m = static_cast<int>(kp::ceil_div(M, BM));
  const int tiles_n = static_cast<int>(kp::ceil_div(N, BN));
  const int per_group = GROUP_M * tiles_n;
  const int group = static_cast<int>(blockIdx.x) / per_group;
  const int first_m = group * GROUP_M;
  const int group_rows = min(tiles_m - first_m, GROUP_M);
  const int in_group = static_cast<int>(blockIdx.x) % per_group;
  const int block_m = (first_m + in_group % group_rows) * BM;
  const int block_n = (in_group / group_rows) * BN;

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int warp_m = warp / WARPS_N;
  const int warp_n = warp % WARPS_N;

  // One k-step of A (BM x BK) and B (BK x BN) into stage `stage`, in 16-byte chunks.
  auto load_stage = [&](int stage, int k0) {
    T* a_dst = As + stage * A_STAGE;
    T* b_dst = Bs + stage * B_STAGE;
#pragma unroll
    for (int i = 0; i < BM * A_CHUNKS_PER_ROW / THREADS; ++i) {
      const int id = tid + i * THREADS;
      const int r = id / A_CHUNKS_PER_ROW;
      const int c = id % A_CHUNKS_PER_ROW;
      const int row = block_m + r;
      const int k = k0 + c * CHUNK;
      T* dst = a_dst + a_offset(r, c);
      if constexpr (ALIGNED) {
        const bool valid = row < M && k < K;  // K % 8 == 0: a chunk is all in or all out
        cp_async_16(dst, valid ? A + static_cast<size_t>(row) * K + k : A, valid);
      } else {
        T v[CHUNK];
#pragma unroll
        for (int e = 0; e < CHUNK; ++e) {
          v[e] = row < M && k + e < K ? A[static_cast<size_t>(row) * K + k + e] : T(0.f);
        }
        memcpy(dst, v, sizeof(v));
      }
    }
#pragma unroll
    for (int i = 0; i < BK * B_CHUNKS_PER_ROW / THREADS; ++i) {
      const int id = tid + i * THREADS;
      const int r = id / B_CHUNKS_PER_ROW;
      const int c = id % B_CHUNKS_PER_ROW;
      const int k = k0 + r;
      const int col = block_n + c * CHUNK;
      T* dst = b_dst + b_offset<BN>(r, c);
      if constexpr (ALIGNED) {
        const bool valid = k < K && col < N;  // N % 8 == 0
        cp_async_16(dst, valid ? B + static_cast<size_t>(k) * N + col : B, valid);
      } else {
        T v[CHUNK];
#pragma unroll
        for (int e = 0; e < CHUNK; ++e) {
          v[e] = k < K && col + e < N ? B[static_cast<size_t>(k) * N + col + e] : T(0.f);
        }
        memcpy(dst, v, sizeof(v));
      }
    }
  };

  float acc[FRAG_M][FRAG_N][4] = {};
  const int k_steps = static_cast<int>(kp::ceil_div(K, BK));

  // Prologue: STAGES - 1 k-steps in flight. Every iteration commits one group (possibly
  // empty), so "group t is complete" is always cp.async.wait_group(STAGES - 2).
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_steps) load_stage(s, s * BK);
    cp_async_commit();
  }

  for (int step = 0; step < k_steps; ++step) {
    cp_async_wait<STAGES - 2>();
    // Step `step` has landed for every thread, and every warp is done with step - 1, whose
    // stage the next load overwrites.
    __syncthreads();
    const int ahead = step + STAGES - 1;
    if (ahead < k_steps) load_stage(ahead % STAGES, ahead * BK);
    cp_async_commit();

    const T* a_tile = As + (step % STAGES) * A_STAGE;
    const T* b_tile = Bs + (step % STAGES) * B_STAGE;
#pragma unroll
    for (int kk = 0; kk < BK; kk += MMA_K) {
      unsigned a_frag[FRAG_M][4];
      unsigned b_frag[FRAG_N][2];
#pragma unroll
      for (int mi = 0; mi < FRAG_M; ++mi) {
        // Lanes 0-15 address rows 0-15 at k 0-7, lanes 16-31 the same rows at k 8-15.
        const int r = warp_m * WM + mi * MMA_M + lane % 16;
        ldmatrix_x4(a_frag[mi], a_tile + a_offset(r, kk / CHUNK + lane / 16));
      }
#pragma unroll
      for (int nj = 0; nj < FRAG_N / 2; ++nj) {
        // Lanes 0-15 address k rows 0-15 of n-tile 2nj, lanes 16-31 those of n-tile 2nj + 1.
        const int r = kk + lane % 16;
        const int c = (warp_n * WN + nj * 2 * MMA_N) / CHUNK + lane / 16;
        unsigned q[4];
        ldmatrix_x4_trans(q, b_tile + b_offset<BN>(r, c));
        b_frag[2 * nj][0] = q[0];
        b_frag[2 * nj][1] = q[1];
        b_frag[2 * nj + 1][0] = q[2];
        b_frag[2 * nj + 1][1] = q[3];
      }
#pragma unroll
      for (int mi = 0; mi < FRAG_M; ++mi) {
#pragma unroll
        for (int ni = 0; ni < FRAG_N; ++ni) mma_16816<T>(acc[mi][ni], a_frag[mi], b_frag[ni]);
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue: accumulator (mi, ni) holds rows gid and gid + 8, columns 2 * (lane % 4) + {0, 1}
  // of its 16 x 8 tile.
  const int gid = lane / 4;
  const int pair = (lane % 4) * 2;
#pragma unroll
  for (int mi = 0; mi < FRAG_M; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = block_m + warp_m * WM + mi * MMA_M + gid + half * 8;
      if (row >= M) continue;
      T* c_row = C + static_cast<size_t>(row) * N;
#pragma unroll
      for (int ni = 0; ni < FRAG_N; ++ni) {
        const int col = block_n + warp_n * WN + ni * MMA_N + pair;
        const float lo = acc[mi][ni][2 * half];
        const float hi = acc[mi][ni][2 * half + 1];
        if constexpr (ALIGNED) {
          if (col < N) store_pair<T>(c_row + col, lo, hi);  // N % 8 == 0: both in or both out
        } else {
          if (col < N) c_row[col] = kp::from_float<T>(lo);
          if (col + 1 < N) c_row[col + 1] = kp::from_float<T>(hi);
        }
      }
    }
  }
}

// ----------------------------------------------------------------------------------------------
// Launchers

namespace {

template <typename T, int BM, int BN, bool ALIGNED>
cudaError_t launch(const void* a, const void* b, void* c, int M, int N, int K,
                   cudaStream_t stream) {
  using Config = Tile<BM, BN>;
  auto kernel = kernelperf_gemm_mma<T, BM, BN, ALIGNED>;
  cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            Config::SMEM_BYTES);
  if (status != cudaSuccess) return status;
  const long long blocks = kp::ceil_div(M, BM) * kp::ceil_div(N, BN);
  if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
  kernel<<<static_cast<unsigned>(blocks), Config::THREADS, Config::SMEM_BYTES, stream>>>(
      static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(c), M, N, K);
  return cudaGetLastError();
}

template <typename T, int BM, int BN>
cudaError_t launch_aligned(const void* a, const void* b, void* c, int M, int N, int K,
                           bool aligned, cudaStream_t stream) {
  if (aligned && (K % CHUNK != 0 || N % CHUNK != 0)) return cudaErrorInvalidValue;
  return aligned ? launch<T, BM, BN, true>(a, b, c, M, N, K, stream)
                 : launch<T, BM, BN, false>(a, b, c, M, N, K, stream);
}

template <typename T>
cudaError_t launch_dtype(const void* a, const void* b, void* c, int M, int N, int K,
                         int block_n, bool aligned, cudaStream_t stream) {
  switch (block_n) {
    case 128: return launch_aligned<T, 128, 128>(a, b, c, M, N, K, aligned, stream);
    case 256: return launch_aligned<T, 128, 256>(a, b, c, M, N, K, aligned, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

// C = A @ B, bf16 or f16 (KpDtype) row-major, float32 accumulation, 128 x block_n tiles
// (block_n: 128 or 256). aligned: K % 8 == 0, N % 8 == 0, A and B 16-byte aligned (cp.async).
KP_EXPORT int kernelperf_gemm_mma(const void* A, const void* B, void* C, int M, int N, int K,
                                  int dtype, int block_n, int aligned, void* stream) {
  if (M < 1 || N < 1 || K < 1) return cudaErrorInvalidValue;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case KP_BF16: return launch_dtype<__nv_bfloat16>(A, B, C, M, N, K, block_n, aligned, s);
    case KP_F16: return launch_dtype<__half>(A, B, C, M, N, K, block_n, aligned, s);
    default: return cudaErrorInvalidValue;
  }
}
