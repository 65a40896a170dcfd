// C = A @ B for bf16 or f16 on Hopper tensor cores (sm_90a): TMA loads, an mbarrier ring and
// wgmma.mma_async, float32 accumulation, output in the input dtype. A: M x K, B: K x N, C: M x N,
// all row-major. Launched from kernels/ops/matmul/cuda_wgmma.py.
//
// Versions:
//   kernelperf_gemm_wgmma<T>  persistent warp-specialised kernel, one CTA per SM, 384 threads
//       in three warpgroups, each CTA walking the BM x BN = 128 x 256 tiles of C in a grouped
//       order (GROUP_M tile-rows at a time, so that the tiles in flight share A rows and B
//       columns in L2).
//       - Producer (warpgroup 0, one thread; setmaxnreg gives its registers away): for every
//         k-step of BK = 64 it waits until ring slot s is empty, then issues TMA loads
//         (cp.async.bulk.tensor, 128-byte swizzle, zero fill past the matrix edges) of the A
//         tile (BM x BK, K-major) and of the B tile (BK x BN, as four 64-column boxes: B is
//         N-major in memory) into slot s, whose "full" mbarrier counts the bytes arriving.
//       - Consumers (warpgroups 1 and 2, 64 rows of the tile each, 128 f32 accumulators per
//         thread): wait on slot s's full barrier, issue four wgmma.mma_async.m64n256k16 from
//         shared-memory descriptors (A K-major; B MN-major through the instruction's transpose
//         bit, which 16-bit types allow), commit, and keep one wgmma group in flight: once
//         group t - 1 has retired its slot is released (empty mbarrier, one arrival per warp).
//         The epilogue converts the accumulators and stores them straight from registers,
//         guarded at the matrix edge; the producer is meanwhile loading the next tile.
//       The ring holds STAGES = 4 slots of 48 KiB (192 KiB of shared memory). TMA needs
//       16-byte aligned row strides: K % 8 == 0 and N % 8 == 0 (the launcher refuses others).
//       Built for any target, but the kernel body exists only on sm_90a (wgmma, setmaxnreg);
//       the launcher refuses other devices.

#include <cuda.h>  // CUtensorMap and its enums (types only: the driver is reached at run time)
#include <cudaTypedefs.h>

#include <type_traits>

#include "common.cuh"

namespace {
constexpr int BM = 128;
constexpr int BN = 256;
constexpr int BK = 64;              // one 128-byte swizzle row of 16-bit elements
constexpr int B_BOX_N = 64;         // TMA boxes of B: 64 columns (128 bytes) x BK rows
constexpr int STAGES = 4;
constexpr int CONSUMERS = 2;        // warpgroups issuing wgmma, 64 rows of the tile each
constexpr int THREADS = 128 * (CONSUMERS + 1);
constexpr int PRODUCER_REGISTERS = 40;
constexpr int CONSUMER_REGISTERS = 232;
constexpr int A_STAGE_BYTES = BM * BK * 2;  // 16 KiB
constexpr int B_BOX_BYTES = BK * B_BOX_N * 2;  // 8 KiB
constexpr int B_STAGE_BYTES = BK * BN * 2;  // 32 KiB
constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;
constexpr int SWIZZLE_ATOM = 1024;  // 8 rows of 128 bytes: the 128-byte swizzle's period
// Ring, its barriers (full and empty per slot), and slack to align the ring to the atom.
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 2 * STAGES * 8 + SWIZZLE_ATOM;
constexpr int GROUP_M_DEFAULT = 16;
static_assert(THREADS * (CONSUMERS * CONSUMER_REGISTERS + PRODUCER_REGISTERS) / (CONSUMERS + 1)
                  <= 65536, "setmaxnreg targets must fit the register file");
static_assert(A_STAGE_BYTES % SWIZZLE_ATOM == 0 && B_BOX_BYTES % SWIZZLE_ATOM == 0,
              "every TMA box starts on a swizzle atom");

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KP_HAS_WGMMA 1
constexpr int WG_M = BM / CONSUMERS;  // rows of the tile per consumer
constexpr int WGMMA_K = 16;
constexpr int ACC = WG_M * BN / 128;  // f32 accumulators per consumer thread: 128

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier (PTX ISA: "Parallel Synchronization and Communication Instructions: mbarrier")

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Spin until the phase with parity `parity` has completed (labels are local to the braces).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// ---- TMA: a 2-D box global -> shared; completion counted in bytes on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int inner, int outer) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(bar)
      : "memory");
}

// ---- wgmma (PTX ISA: "Asynchronous Warpgroup Level Matrix Multiply-Accumulate")

// Shared-memory matrix descriptor: start address, leading / stride byte offsets (all >> 4),
// layout 1 = 128-byte swizzle in bits 62-63; base offset 0 (every atom is 1024-byte aligned).
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t address, uint32_t leading,
                                                    uint32_t stride) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) |
         static_cast<uint64_t>((leading & 0x3FFFF) >> 4) << 16 |
         static_cast<uint64_t>((stride & 0x3FFFF) >> 4) << 32 | 1ull << 62;
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across this point (the
// asynchronous wgmma writes them behind the compiler's back until wgmma_wait).
__device__ __forceinline__ void fence_accumulators(float (&d)[ACC]) {
#pragma unroll
  for (int i = 0; i < ACC; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define KP_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
                 "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define KP_D128 KP_D8(0), KP_D8(8), KP_D8(16), KP_D8(24), KP_D8(32), KP_D8(40), KP_D8(48), \
                KP_D8(56), KP_D8(64), KP_D8(72), KP_D8(80), KP_D8(88), KP_D8(96), KP_D8(104), \
                KP_D8(112), KP_D8(120)
#define KP_R128                                                                               \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                   \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "           \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "           \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "           \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "           \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "           \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, "     \
  "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, " \
  "%126, %127}"
// d += A (64 x 16, K-major) @ B (16 x 256, N-major: imm-trans-b = 1); scale-d = 1.
#define KP_WGMMA_M64N256K16(TYPE)                                                          \
  asm volatile("{\n"                                                                       \
               ".reg .pred p;\n"                                                           \
               "setp.ne.b32 p, %130, 0;\n"                                                 \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " " KP_R128   \
               ", %128, %129, p, 1, 1, 0, 1;\n"                                            \
               "}\n"                                                                       \
               : KP_D128                                                                   \
               : "l"(desc_a), "l"(desc_b), "r"(1)                                          \
               : "memory")

template <typename T>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[ACC], uint64_t desc_a,
                                                 uint64_t desc_b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    KP_WGMMA_M64N256K16("bf16");
  } else {
    KP_WGMMA_M64N256K16("f16");
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

// Tile `tile` of the grouped order -> its first row and column of C (as in gemm_mma.cu).
__device__ __forceinline__ void tile_origin(int tile, int tiles_m, int tiles_n, int group_m,
                                            int& row, int& col) {
  const int per_group = group_m * tiles_n;
  const int first_m = tile / per_group * group_m;
  const int group_rows = min(tiles_m - first_m, group_m);
  const int in_group = tile % per_group;
  row = (first_m + in_group % group_rows) * BM;
  col = in_group / group_rows * BN;
}

#endif  // sm_90a

}  // namespace

// ----------------------------------------------------------------------------------------------
// Kernel

template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
    kernelperf_gemm_wgmma(const __grid_constant__ CUtensorMap map_a,
                          const __grid_constant__ CUtensorMap map_b, T* __restrict__ C, int M,
                          int N, int K, int group_m) {
#ifdef KP_HAS_WGMMA
  extern __shared__ unsigned char smem_raw[];
  // The ring starts on a swizzle atom: the 128-byte swizzle is a function of address bits 4-9.
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t ring = (raw + SWIZZLE_ATOM - 1) & ~static_cast<uint32_t>(SWIZZLE_ATOM - 1);
  const uint32_t full_bars = ring + STAGES * STAGE_BYTES;
  const uint32_t empty_bars = full_bars + STAGES * 8;
  auto slot_a = [&](int s) { return ring + s * STAGE_BYTES; };
  auto slot_b = [&](int s) { return ring + s * STAGE_BYTES + A_STAGE_BYTES; };

  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bars + 8 * s, 1);                // the producer's expect_tx arrival
      mbar_init(empty_bars + 8 * s, CONSUMERS * 4);   // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();

  const int tiles_m = static_cast<int>(kp::ceil_div(M, BM));
  const int tiles_n = static_cast<int>(kp::ceil_div(N, BN));
  const int tiles = tiles_m * tiles_n;
  const int k_steps = static_cast<int>(kp::ceil_div(K, BK));

  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGISTERS));
    if (threadIdx.x != 0) return;
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_a))
                 : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_b))
                 : "memory");
    int step = 0;  // k-steps issued by this CTA, across its tiles: slot and phase
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      int row, col;
      tile_origin(tile, tiles_m, tiles_n, group_m, row, col);
      for (int k = 0; k < k_steps; ++k, ++step) {
        const int s = step % STAGES;
        // The first pass over the ring waits on parity 1, which a fresh barrier reports done.
        mbar_wait(empty_bars + 8 * s, ((step / STAGES) & 1) ^ 1);
        const uint32_t full = full_bars + 8 * s;
        mbar_expect_tx(full, STAGE_BYTES);  // whole boxes count, zero-filled parts included
        tma_load_2d(slot_a(s), &map_a, full, k * BK, row);
#pragma unroll
        for (int box = 0; box < BN / B_BOX_N; ++box) {
          tma_load_2d(slot_b(s) + box * B_BOX_BYTES, &map_b, full, col + box * B_BOX_N, k * BK);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGISTERS));
  const int consumer = warpgroup - 1;
  const int t = threadIdx.x % 128;
  const int warp = t / 32;
  const int lane = t % 32;
  float d[ACC];
  int step = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    int row, col;
    tile_origin(tile, tiles_m, tiles_n, group_m, row, col);
#pragma unroll
    for (int i = 0; i < ACC; ++i) d[i] = 0.f;
    fence_accumulators(d);
    for (int k = 0; k < k_steps; ++k, ++step) {
      const int s = step % STAGES;
      mbar_wait(full_bars + 8 * s, (step / STAGES) & 1);
      // A: this warpgroup's 64 rows, K-major, rows 128 bytes apart, 8-row atoms 1024 apart
      // (the leading offset is unused for K-major swizzled tiles); each k16 slice starts
      // 32 bytes further along the (swizzled) row.
      // B: N-major, 64-column boxes 8 KiB apart (leading offset), 8-row atoms 1024 bytes apart
      // (stride offset); each k16 slice is 16 rows = 2 KiB further.
      const uint32_t a_base = slot_a(s) + consumer * WG_M * BK * 2;
      const uint32_t b_base = slot_b(s);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / WGMMA_K; ++kk) {
        const uint64_t desc_a = smem_descriptor(a_base + kk * WGMMA_K * 2, 16, SWIZZLE_ATOM);
        const uint64_t desc_b =
            smem_descriptor(b_base + kk * WGMMA_K * B_BOX_N * 2, B_BOX_BYTES, SWIZZLE_ATOM);
        wgmma_m64n256k16<T>(d, desc_a, desc_b);
      }
      wgmma_commit();
      // Keep this k-step's group in flight; the previous one has retired: free its slot.
      wgmma_wait<1>();
      if (k > 0 && lane == 0) mbar_arrive(empty_bars + 8 * ((step - 1) % STAGES));
    }
    wgmma_wait<0>();
    fence_accumulators(d);
    if (k_steps > 0 && lane == 0) mbar_arrive(empty_bars + 8 * ((step - 1) % STAGES));

    // Accumulator layout (PTX ISA, "wgmma Register Fragment: Matrix D", m64nNk16, f32):
    // d[i] sits at row 16 * warp + lane / 4 + 8 * (i / 2 % 2), column 8 * (i / 4) +
    // 2 * (lane % 4) + i % 2 of this warpgroup's 64 x 256 block.
    const int row0 = row + consumer * WG_M + warp * 16 + lane / 4;
    const int col0 = col + 2 * (lane % 4);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row0 + 8 * half;
      if (r >= M) continue;
      T* c_row = C + static_cast<size_t>(r) * N;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int c = col0 + 8 * j;
        if (c < N) store_pair<T>(c_row + c, d[4 * j + 2 * half], d[4 * j + 2 * half + 1]);
      }
    }
  }
#endif  // KP_HAS_WGMMA
}

// ----------------------------------------------------------------------------------------------
// Launcher

namespace {

// cuTensorMapEncodeTiled, reached through the runtime's driver entry point, so the library needs
// no link against libcuda (it loads, for the compile-only tests, on machines without a driver).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A rows x cols row-major 16-bit matrix, read in boxes of box_rows x box_cols (box_cols * 2 ==
// 128 bytes, the swizzle span), zero-filled outside the matrix.
bool encode_2d(CUtensorMap* map, CUtensorMapDataType type, const void* base, int rows, int cols,
               int box_rows, int box_cols) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};  // bytes, of dim 1
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols),
                             static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <typename T>
cudaError_t launch(const void* a, const void* b, void* c, int M, int N, int K, int group_m,
                   cudaStream_t stream) {
  int device = 0, major = 0, minor = 0, sms = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess) {
    status = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  }
  if (status == cudaSuccess) {
    status = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  }
  if (status == cudaSuccess) {
    status = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (status != cudaSuccess) return status;
  if (major != 9 || minor != 0) return cudaErrorInvalidDeviceFunction;  // sm_90a only

  constexpr auto type = std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                         : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap map_a, map_b;
  if (!encode_2d(&map_a, type, a, M, K, BM, BK) ||
      !encode_2d(&map_b, type, b, K, N, BK, B_BOX_N)) {
    return cudaErrorInvalidValue;
  }
  auto kernel = kernelperf_gemm_wgmma<T>;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
  if (status != cudaSuccess) return status;
  const long long tiles = kp::ceil_div(M, BM) * kp::ceil_div(N, BN);
  if (tiles > 0x7fffffffLL) return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>(tiles < sms ? tiles : sms);
  kernel<<<grid, THREADS, SMEM_BYTES, stream>>>(map_a, map_b, static_cast<T*>(c), M, N, K,
                                                group_m);
  return cudaGetLastError();
}

}  // namespace

// C = A @ B, bf16 or f16 (KpDtype) row-major, float32 accumulation, on an sm_90 device.
// Needs K % 8 == 0, N % 8 == 0 and 16-byte aligned A, B (TMA) and C; group_m >= 1 (tile-rows
// per group of the tile order; 0 takes the default).
KP_EXPORT int kernelperf_gemm_wgmma(const void* A, const void* B, void* C, int M, int N, int K,
                                    int dtype, int group_m, void* stream) {
  if (M < 1 || N < 1 || K < 1 || K % 8 != 0 || N % 8 != 0 || group_m < 0) {
    return cudaErrorInvalidValue;
  }
  for (const void* p : {A, B, static_cast<const void*>(C)}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return cudaErrorMisalignedAddress;
  }
  if (group_m == 0) group_m = GROUP_M_DEFAULT;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case KP_BF16: return launch<__nv_bfloat16>(A, B, C, M, N, K, group_m, s);
    case KP_F16: return launch<__half>(A, B, C, M, N, K, group_m, s);
    default: return cudaErrorInvalidValue;
  }
}
