// How fast a GPU streams a weight matrix's codes by the shape of what a block reads a step: the
// portable planes (row-major codes, so a block of `tr` rows reads `tr` runs of `seg` bytes a step,
// one per row, each `row_bytes` apart) against a tile-contiguous layout (the same step's bytes one
// run of tr * seg). Two ways to load: 16-byte loads by every thread (`ldg`, `unroll` steps in
// flight), and the copy engine (`tma`: one thread, a ring of `stages` slots on mbarriers; the planes
// by a 2-D tensor map box of seg bytes x tr rows, the tiles by one 1-D bulk copy). Nothing is
// computed: each slot's first word is XORed into a per-block result so the loads stay.
//
// Build and run on the GPU box (prints JSON lines: pattern, shape, GB/s):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a benchmarks/load_pattern.cu \
//        -o /tmp/load_pattern && /tmp/load_pattern
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e = (x);                                                             \
    if (e != cudaSuccess) {                                                          \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

// A step's byte `e` (16-byte unit `u`) of block `b`, step `s`: its offset in the buffer.
__device__ __forceinline__ long offset(int tile, long b, long s, long u, int tr, int seg, long row_bytes,
                                       long steps) {
  if (tile) return ((b * steps + s) * tr * seg) + u * 16;
  long per_row = seg / 16;
  return (b * tr + u / per_row) * row_bytes + s * seg + (u % per_row) * 16;
}

template <int U, int J>
__global__ void ldg(const char* __restrict__ w, long row_bytes, int tr, int seg, int tile, unsigned* out) {
  long steps = row_bytes / seg, b = blockIdx.x, per = steps / gridDim.y, s1 = (blockIdx.y + 1) * per;
  unsigned acc = 0;
  for (long s0 = blockIdx.y * per; s0 < s1; s0 += U) {
    uint4 v[U][J];
#pragma unroll
    for (int i = 0; i < U; ++i)
#pragma unroll
      for (int j = 0; j < J; ++j) {
        long u = threadIdx.x + j * blockDim.x;
        v[i][j] = s0 + i < s1 ? __ldg(reinterpret_cast<const uint4*>(
                                    w + offset(tile, b, s0 + i, u, tr, seg, row_bytes, steps)))
                              : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int i = 0; i < U; ++i)
#pragma unroll
      for (int j = 0; j < J; ++j) acc ^= v[i][j].x ^ v[i][j].w;
  }
  if (acc == 0x12345678u) out[b] = acc;
}

// a step's 16-byte loads a thread (j) of 256: the kernel that keeps 8 of them in flight
void launch_ldg(dim3 grid, const char* base, long row_bytes, int tr, int seg, int tile, unsigned* out) {
  switch (tr * seg / 16 / 256) {
    case 1: ldg<8, 1><<<grid, 256>>>(base, row_bytes, tr, seg, tile, out); break;
    case 2: ldg<4, 2><<<grid, 256>>>(base, row_bytes, tr, seg, tile, out); break;
    case 4: ldg<2, 4><<<grid, 256>>>(base, row_bytes, tr, seg, tile, out); break;
    case 8: ldg<1, 8><<<grid, 256>>>(base, row_bytes, tr, seg, tile, out); break;
    default: fprintf(stderr, "tr * seg %d: 4..32 KB\n", tr * seg); exit(1);
  }
}

__device__ __forceinline__ unsigned smem(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__global__ void tma(const __grid_constant__ CUtensorMap map, const char* __restrict__ w, long row_bytes, int tr,
                    int seg, int tile, int stages, unsigned* out) {
  extern __shared__ __align__(1024) char ring[];
  __shared__ __align__(8) unsigned long long full[16];
  long steps = row_bytes / seg, b = blockIdx.x, per = steps / gridDim.y, s0 = blockIdx.y * per;
  unsigned slot_bytes = tr * seg;
  if (threadIdx.x != 0) return;
  for (int i = 0; i < stages; ++i)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem(&full[i])));
  asm volatile("fence.mbarrier_init.release.cluster;");
  asm volatile("fence.proxy.async.shared::cta;");
  auto issue = [&](long s) {
    int i = (s - s0) % stages;
    unsigned bar = smem(&full[i]), dst = smem(ring + (long)i * slot_bytes);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(slot_bytes));
    if (tile) {
      const char* src = w + (b * steps + s) * slot_bytes;
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
          "l"(src), "r"(slot_bytes), "r"(bar)
          : "memory");
    } else {
      int x = (int)(s * seg), y = (int)(b * tr);
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
              dst),
          "l"(&map), "r"(x), "r"(y), "r"(bar)
          : "memory");
    }
  };
  unsigned acc = 0;
  for (long s = 0; s < (stages < per ? stages : per); ++s) issue(s0 + s);
  for (long s = 0; s < per; ++s) {
    int i = s % stages;
    unsigned parity = (s / stages) & 1, bar = smem(&full[i]), done = 0;
    while (!done)
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
          : "=r"(done)
          : "r"(bar), "r"(parity)
          : "memory");
    acc ^= *reinterpret_cast<volatile unsigned*>(ring + (long)i * slot_bytes);
    asm volatile("fence.proxy.async.shared::cta;");
    if (s + stages < per) issue(s0 + s + stages);
  }
  if (acc == 0x12345678u) out[b] = acc;
}

struct Shape {
  long n, k;
};

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int sms = prop.multiProcessorCount;
  const long pool = 1L << 30;  // weight copies rotated through, well past L2
  char* buf;
  CK(cudaMalloc(&buf, pool));
  CK(cudaMemset(buf, 1, pool));
  unsigned* out;
  CK(cudaMalloc(&out, 1 << 20));
  CK(cudaFuncSetAttribute(tma, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<Shape> shapes = {{28672, 8192}, {14336, 4096}, {4096, 14336}, {8192, 8192}};
  auto encode = [](CUtensorMap* map, const char* base, long rows, long row_bytes, int seg, int tr) {
    cuuint64_t dims[2] = {(cuuint64_t)row_bytes, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)row_bytes};
    cuuint32_t box[2] = {(cuuint32_t)seg, (cuuint32_t)tr}, elem[2] = {1, 1};
    static PFN_cuTensorMapEncodeTiled_v12000 encode_tiled = nullptr;
    if (!encode_tiled) {
      cudaDriverEntryPointQueryResult q;
      CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode_tiled, 12000,
                                          cudaEnableDefault, &q));
    }
    CUresult r = encode_tiled(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void*)base, dims, strides, box,
                                        elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
      fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", (int)r);
      exit(1);
    }
  };
  // time(launch(copy base)) over the rotating copies: median of 21 of 3 warm-ups
  auto time = [&](long bytes, auto launch) {
    long copies = std::max(1L, pool / bytes);
    std::vector<float> ts;
    for (int it = 0; it < 24; ++it) {
      const char* base = buf + (it % copies) * bytes;
      CK(cudaEventRecord(e0));
      launch(base);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (it >= 3) ts.push_back(ms * 1e3f);
    }
    CK(cudaGetLastError());
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
  };
  for (auto sh : shapes) {
    long row_bytes = sh.k / 2, bytes = sh.n * row_bytes;
    for (int tr : {64, 128}) {
      long blocks = sh.n / tr;
      for (int seg : {64, 128, 256}) {
        long steps = row_bytes / seg;
        for (int splits : {1, 2, 4, 8}) {
          if (steps % splits || (splits > 1 && blocks * splits / 2 >= 2L * sms)) continue;
          dim3 grid(blocks, splits);
          for (int tile = 0; tile < 2; ++tile) {
            float us = time(bytes, [&](const char* base) { launch_ldg(grid, base, row_bytes, tr, seg, tile, out); });
            printf("{\"way\": \"ldg\", \"n\": %ld, \"k\": %ld, \"tr\": %d, \"seg\": %d, \"splits\": %d, "
                   "\"layout\": \"%s\", \"us\": %.2f, \"gbs\": %.0f}\n",
                   sh.n, sh.k, tr, seg, splits, tile ? "tile" : "planes", us, bytes / us / 1e3);
          }
          for (int stages : {4, 8}) {
            for (int per_sm : {1, 2, 4}) {
              long ring = (long)stages * tr * seg, pad = 200L * 1024 / per_sm;
              if (ring > pad) continue;
              for (int tile = 0; tile < 2; ++tile) {
                float us = time(bytes, [&](const char* base) {
                  CUtensorMap map;
                  encode(&map, base, sh.n, row_bytes, seg, tr);
                  tma<<<grid, 32, pad>>>(map, base, row_bytes, tr, seg, tile, stages, out);
                });
                printf("{\"way\": \"tma\", \"n\": %ld, \"k\": %ld, \"tr\": %d, \"seg\": %d, \"splits\": %d, "
                       "\"layout\": \"%s\", \"stages\": %d, \"per_sm\": %d, \"us\": %.2f, \"gbs\": %.0f}\n",
                       sh.n, sh.k, tr, seg, splits, tile ? "tile" : "planes", stages, per_sm, us, bytes / us / 1e3);
              }
            }
          }
        }
      }
    }
    fflush(stdout);
  }
  return 0;
}
