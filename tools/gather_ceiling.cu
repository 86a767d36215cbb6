// How fast can this GPU gather the rows of EmbeddingBag's PR configuration (5,000,000 x 128
// float32 weights, 2,048 bags of 0-300 random ids)? The ceiling the tuned forward is held to:
//
//   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/gather_ceiling tools/gather_ceiling.cu && /tmp/gather_ceiling
//
// Side by side in one process, CUDA events around each launch, median of 30 back to back (as the
// bench's profiler sees the op, no L2 flush): a streaming read and a copy of the same bytes; a
// flat gather (the ids split evenly over the warps, no bags: perfect balance) with plain loads
// or a cp.async ring of rows in shared memory (no registers held by rows in flight); and the
// same per bag chunk (a warp per 32 or 64 entries, as the `split` variants, without the pass
// that adds the chunks' partials). The ring kernels must give the plain ones' exact bits.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <random>
#include <cstdint>
#include <cstring>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

constexpr long long ROWS = 5000000;
constexpr int DIM = 128;

// ---------------------------------------------------------------- flat, plain loads
template <int U>
__global__ void flat_plain(const float4* __restrict__ w, const long long* __restrict__ idx, long long n,
                           float* __restrict__ out) {
  const int lane = threadIdx.x % 32;
  const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  const long long warps = (gridDim.x * (long long)blockDim.x) / 32;
  float4 acc = make_float4(0, 0, 0, 0);
  const long long per = (n + warps - 1) / warps;
  const long long lo = warp * per, hi = min(n, lo + per);
  for (long long j = lo; j < hi; j += U) {
    float4 x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      long long r = j + u < hi ? idx[j + u] : -1;
      x[u] = r >= 0 ? w[r * (DIM / 4) + lane] : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc.x += x[u].x, acc.y += x[u].y, acc.z += x[u].z, acc.w += x[u].w;
  }
  out[warp * 32 + lane] = acc.x + acc.y + acc.z + acc.w;
}

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp16(void* s, const void* g) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(s)), "l"(g) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_group() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// ---------------------------------------------------------------- flat, cp.async ring of S rows per warp
template <int S, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) flat_cpasync(const float4* __restrict__ w, const long long* __restrict__ idx,
                                                        long long n, float* __restrict__ out) {
  __shared__ float4 ring[WARPS][S][32];
  const int lane = threadIdx.x % 32, wib = threadIdx.x / 32;
  const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  const long long warps = (gridDim.x * (long long)blockDim.x) / 32;
  const long long per = (n + warps - 1) / warps;
  const long long lo = warp * per, hi = min(n, lo + per);
  float4 acc = make_float4(0, 0, 0, 0);
#pragma unroll
  for (int s = 0; s < S; ++s) {
    if (lo + s < hi) cp16(&ring[wib][s][lane], w + idx[lo + s] * (DIM / 4) + lane);
    commit();
  }
  for (long long j = lo; j < hi; j += S) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      wait_group<S - 1>();
      if (j + s < hi) {
        float4 x = ring[wib][s][lane];
        acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
      }
      if (j + s + S < hi) cp16(&ring[wib][s][lane], w + idx[j + s + S] * (DIM / 4) + lane);
      commit();
    }
  }
  out[warp * 32 + lane] = acc.x + acc.y + acc.z + acc.w;
}

// ---------------------------------------------------------------- bags: one warp per chunk of C entries, plain loads (as the winner)
template <int U, int C>
__global__ void bags_plain(const float4* __restrict__ w, const long long* __restrict__ idx, const long long* __restrict__ offs,
                           long long bags, long long n, int splits, float4* __restrict__ partial, float4* __restrict__ out) {
  const int lane = threadIdx.x % 32;
  const long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  const long long bag = g / splits, chunk = g % splits;
  if (bag >= bags) return;
  const long long start = offs[bag], end = bag + 1 < bags ? offs[bag + 1] : n;
  const long long first = start + chunk * C;
  if (chunk > 0 && first >= end) return;
  const long long last = min(end, first + C);
  float4 acc = make_float4(0, 0, 0, 0);
  for (long long j = first; j < last; j += U) {
    float4 x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      long long r = j + u < last ? idx[j + u] : -1;
      x[u] = r >= 0 ? w[r * (DIM / 4) + lane] : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc.x += x[u].x, acc.y += x[u].y, acc.z += x[u].z, acc.w += x[u].w;
  }
  partial[g * 32 + lane] = acc;  // no combine: the same bytes written for every variant here
}

// ---------------------------------------------------------------- bags: cp.async ring
template <int S, int C, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) bags_cpasync(const float4* __restrict__ w, const long long* __restrict__ idx,
                                                        const long long* __restrict__ offs, long long bags, long long n,
                                                        int splits, float4* __restrict__ partial) {
  __shared__ float4 ring[WARPS][S][32];
  const int lane = threadIdx.x % 32, wib = threadIdx.x / 32;
  const long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  const long long bag = g / splits, chunk = g % splits;
  if (bag >= bags) return;
  const long long start = offs[bag], end = bag + 1 < bags ? offs[bag + 1] : n;
  const long long first = start + chunk * C;
  if (chunk > 0 && first >= end) return;
  const long long last = min(end, first + C);
  float4 acc = make_float4(0, 0, 0, 0);
#pragma unroll
  for (int s = 0; s < S; ++s) {
    if (first + s < last) cp16(&ring[wib][s][lane], w + idx[first + s] * (DIM / 4) + lane);
    commit();
  }
  for (long long j = first; j < last; j += S) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      wait_group<S - 1>();
      if (j + s < last) {
        float4 x = ring[wib][s][lane];
        acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
      }
      if (j + s + S < last) cp16(&ring[wib][s][lane], w + idx[j + s + S] * (DIM / 4) + lane);
      commit();
    }
  }
  partial[g * 32 + lane] = acc;
}

// ---------------------------------------------------------------- streaming read and copy
__global__ void read_all(const float4* __restrict__ a, long long n4, float* out) {
  float4 acc = make_float4(0, 0, 0, 0);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
    float4 x = a[i];
    acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
  }
  if (acc.x == 12345.f) out[0] = acc.y;
}
__global__ void copy_all(const float4* __restrict__ a, float4* __restrict__ b, long long n4) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) b[i] = a[i];
}

__global__ void fill(float* w, long long count) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count; i += (long long)gridDim.x * blockDim.x) {
    unsigned long long h = (unsigned long long)i * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    w[i] = (float)(h % 2001) / 1000.f - 1.f;
  }
}

template <typename T>
bool same(const T* a, const T* b, long long count) {
  std::vector<T> x(count), y(count);
  CK(cudaMemcpy(x.data(), a, count * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(y.data(), b, count * sizeof(T), cudaMemcpyDeviceToHost));
  return memcmp(x.data(), y.data(), count * sizeof(T)) == 0;
}

template <typename F>
float time_us(F f, int reps = 30) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < 3; ++i) f();
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::mt19937_64 rng(1234);
  const long long bags = 2048;
  std::vector<long long> offs(bags);
  long long n = 0;
  int maxlen = 0;
  for (long long b = 0; b < bags; ++b) {
    offs[b] = n;
    int len = (int)(rng() % 301);
    maxlen = std::max(maxlen, len);
    n += len;
  }
  std::vector<long long> idx(n);
  for (auto& r : idx) r = (long long)(rng() % ROWS);
  printf("ids %lld, max bag %d, rows moved %.1f MB\n", n, maxlen, n * 512.0 / 1e6);
  float *w, *out;
  long long *didx, *doffs;
  CK(cudaMalloc(&w, ROWS * DIM * 4));
  CK(cudaMalloc(&didx, n * 8));
  CK(cudaMalloc(&doffs, bags * 8));
  CK(cudaMalloc(&out, 64 << 20));
  fill<<<sms * 8, 256>>>(w, ROWS * DIM);
  CK(cudaMemcpy(didx, idx.data(), n * 8, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(doffs, offs.data(), bags * 8, cudaMemcpyHostToDevice));
  const float4* w4 = reinterpret_cast<const float4*>(w);
  const double mb = n * 512.0 / 1e6;
  auto report = [&](const char* name, float us) { printf("%-44s %8.1f us  %5.2f TB/s\n", name, us, mb / us); };

  long long n4 = (long long)(n * 512 / 16);
  float4* dst;
  CK(cudaMalloc(&dst, n4 * 16));
  report("stream read (same bytes)", time_us([&] { read_all<<<sms * 16, 256>>>(w4, n4, out); }));
  report("stream copy (same bytes; TB/s of the read)", time_us([&] { copy_all<<<sms * 16, 256>>>(w4, dst, n4); }));

  for (int wpsm : {16, 32, 48, 64}) {
    int blocks = sms * wpsm / 8;
    char name[64];
    snprintf(name, 64, "flat plain U4 %d warps/SM", wpsm);
    report(name, time_us([&] { flat_plain<4><<<blocks, 256>>>(w4, didx, n, out); }));
    snprintf(name, 64, "flat plain U8 %d warps/SM", wpsm);
    report(name, time_us([&] { flat_plain<8><<<blocks, 256>>>(w4, didx, n, out); }));
    snprintf(name, 64, "flat plain U16 %d warps/SM", wpsm);
    report(name, time_us([&] { flat_plain<16><<<blocks, 256>>>(w4, didx, n, out); }));
  }
  for (int wpsm : {16, 32, 48, 64}) {
    int blocks = sms * wpsm / 8;
    char name[64];
    snprintf(name, 64, "flat cp.async S8 %d warps/SM", wpsm);
    report(name, time_us([&] { flat_cpasync<8, 8><<<blocks, 256>>>(w4, didx, n, out); }));
    if (wpsm <= 48) {
      snprintf(name, 64, "flat cp.async S16 %d warps/SM", wpsm);
      report(name, time_us([&] { flat_cpasync<16, 4><<<blocks * 2, 128>>>(w4, didx, n, out); }));
    }
  }
  float4* partial;
  CK(cudaMalloc(&partial, (long long)bags * 16 * 32 * 16));
  for (int C : {32, 64}) {
    int splits = (maxlen + C - 1) / C;
    long long groups = bags * splits;
    char name[64];
    auto blocks = [&](int warps) { return (int)((groups + warps - 1) / warps); };
    if (C == 64) {
      snprintf(name, 64, "bags plain U4 C64 b128");
      report(name, time_us([&] { bags_plain<4, 64><<<blocks(4), 128>>>(w4, didx, doffs, bags, n, splits, partial, nullptr); }));
      snprintf(name, 64, "bags plain U8 C64 b128");
      report(name, time_us([&] { bags_plain<8, 64><<<blocks(4), 128>>>(w4, didx, doffs, bags, n, splits, partial, nullptr); }));
      snprintf(name, 64, "bags plain U16 C64 b128");
      report(name, time_us([&] { bags_plain<16, 64><<<blocks(4), 128>>>(w4, didx, doffs, bags, n, splits, partial, nullptr); }));
      snprintf(name, 64, "bags cp.async S8 C64 b128");
      report(name, time_us([&] { bags_cpasync<8, 64, 4><<<blocks(4), 128>>>(w4, didx, doffs, bags, n, splits, partial); }));
      snprintf(name, 64, "bags cp.async S16 C64 b128");
      report(name, time_us([&] { bags_cpasync<16, 64, 4><<<blocks(4), 128>>>(w4, didx, doffs, bags, n, splits, partial); }));
      snprintf(name, 64, "bags cp.async S32 C64 b64");
      report(name, time_us([&] { bags_cpasync<32, 64, 2><<<blocks(2), 64>>>(w4, didx, doffs, bags, n, splits, partial); }));
    } else {
      snprintf(name, 64, "bags plain U4 C32 b128");
      report(name, time_us([&] { bags_plain<4, 32><<<blocks(4), 128>>>(w4, didx, doffs, bags, n, splits, partial, nullptr); }));
      snprintf(name, 64, "bags plain U8 C32 b128");
      report(name, time_us([&] { bags_plain<8, 32><<<blocks(4), 128>>>(w4, didx, doffs, bags, n, splits, partial, nullptr); }));
      snprintf(name, 64, "bags cp.async S8 C32 b128");
      report(name, time_us([&] { bags_cpasync<8, 32, 4><<<blocks(4), 128>>>(w4, didx, doffs, bags, n, splits, partial); }));
      snprintf(name, 64, "bags cp.async S16 C32 b128");
      report(name, time_us([&] { bags_cpasync<16, 32, 4><<<blocks(4), 128>>>(w4, didx, doffs, bags, n, splits, partial); }));
    }
  }
  {  // the ring kernels sum the same rows in the same order as the plain ones: equal bits
    float *o1, *o2;
    CK(cudaMalloc(&o1, 1 << 22));
    CK(cudaMalloc(&o2, 1 << 22));
    int blocks = sms * 32 / 8;
    flat_plain<4><<<blocks, 256>>>(w4, didx, n, o1);
    flat_cpasync<8, 8><<<blocks, 256>>>(w4, didx, n, o2);
    printf("flat cp.async == plain: %d\n", (int)same(o1, o2, blocks * 256LL));
    int splits = (maxlen + 63) / 64;
    long long groups = bags * splits;
    float4 *p1, *p2;
    CK(cudaMalloc(&p1, groups * 32 * 16));
    CK(cudaMalloc(&p2, groups * 32 * 16));
    CK(cudaMemset(p1, 0, groups * 32 * 16));
    CK(cudaMemset(p2, 0, groups * 32 * 16));
    bags_plain<1, 64><<<(groups + 3) / 4, 128>>>(w4, didx, doffs, bags, n, splits, p1, nullptr);
    bags_cpasync<16, 64, 4><<<(groups + 3) / 4, 128>>>(w4, didx, doffs, bags, n, splits, p2);
    printf("bags cp.async == plain: %d\n", (int)same(p1, p2, groups * 32));
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
