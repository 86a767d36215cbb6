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
// that adds the chunks' partials). The ring kernels must give the plain ones' exact bits. Then whole
// bags, checked against double sums: per chunk and flat with an ordered combining pass, and a block
// per bag as slices, its bags in order or longest first (sorted on the host, or ordered by a kernel
// on the GPU before the gather). And for 16-bit weights (rows of 256 or
// 128 bytes): a streaming read of as many bytes and flat gathers. And the flat gather and the
// length classes with cache hints on the rows' loads (the L2 fetching 128 or 256 bytes around a
// miss, rows marked first to evict), and the flat gather through the bulk-copy engine (whole rows
// into a ring in shared memory, one cp.async.bulk each, completing on an mbarrier).
//
// Where the gather's time over the read goes comes first (alone with WHERE_ONLY=1 in the
// environment): streaming reads with more loads in flight; the flat gather over other ids (distinct
// rows, sorted rows, a smaller span of the table for the TLBs, runs of consecutive rows for the DRAM
// pages, rows 0..n-1 in order); the ids a lane each with the next 32 loaded ahead; and the flat
// split with no ids at all (a range of rows a warp). On the H100 (five runs): the read 56.3-57.7 us;
// a range of rows a warp with no ids 59.6-61.5; the same with ids, rows in order, 60.9-62.6; random
// rows 61.4-64.7 with the ids loaded ahead (65-67 without), whatever the span or the run length.
// A random gather sits at 1.10-1.13x the read however it is written; 16-bit rows gain nothing
// from loading the ids ahead. Last, whole bags of 16-bit rows in sliced blocks of 16-lane slices
// (the op's 16-bit winners' shapes), with loads through the coherent path as the op's: 37-40 us.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <random>
#include <cstdint>
#include <cmath>
#include <cstring>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

constexpr long long ROWS = 5000000;
constexpr int DIM = 128;

__device__ __forceinline__ void add(float4& acc, const float4& x) { acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w; }

__device__ __forceinline__ void cp16(void* s, const void* g) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(s)), "l"(g) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_group() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// A row's 16 bytes with a cache hint: H = 0 plain (the compiler's non-coherent load), 1 and 2 ask
// the L2 to fetch 128 or 256 bytes around the miss, 3 the same 256 and no L1 allocation, 4 marks
// the lines first to evict from the L2 (rows read once should not push out the ids).
template <int H>
__device__ __forceinline__ float4 load(const float4* p) {
  if constexpr (H == 0) {
    return *p;
  } else {
  float4 v;
  if constexpr (H == 1)
    asm volatile("ld.global.nc.L2::128B.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  if constexpr (H == 2)
    asm volatile("ld.global.nc.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  if constexpr (H == 3)
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  if constexpr (H == 4)
    asm volatile("{\n .reg .b64 pol;\n createpolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
                 " ld.global.nc.L1::no_allocate.L2::cache_hint.v4.f32 {%0,%1,%2,%3}, [%4], pol;\n}"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
  }
}

// Rows idx[lo..hi) summed by a warp (lane: 16 bytes of each row), D rows in flight: plain loads
// unrolled D times, or a ring of D rows in shared memory filled by cp.async (each lane reads back
// only its own 16 bytes, so no barrier). Both add the rows in the same order: equal bits.
// Flat kernels' share of n entries: warp g of the grid takes [lo, hi), the warps' shares equal.
__device__ __forceinline__ void flat_range(long long g, long long n, long long& lo, long long& hi) {
  const long long warps = gridDim.x * (long long)blockDim.x / 32, per = (n + warps - 1) / warps;
  lo = min(n, g * per), hi = min(n, lo + per);
}

template <int D, int H = 0>
__device__ float4 sum_plain(const float4* __restrict__ w, const long long* __restrict__ idx, long long lo, long long hi,
                            int lane) {
  float4 acc = make_float4(0, 0, 0, 0);
  for (long long j = lo; j < hi; j += D) {
    float4 x[D];
#pragma unroll
    for (int u = 0; u < D; ++u) x[u] = j + u < hi ? load<H>(w + idx[j + u] * (DIM / 4) + lane) : make_float4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < D; ++u) add(acc, x[u]);
  }
  return acc;
}

template <int D>
__device__ float4 sum_ring(const float4* __restrict__ w, const long long* __restrict__ idx, long long lo, long long hi,
                           float4 (*ring)[32], int lane) {
  float4 acc = make_float4(0, 0, 0, 0);
#pragma unroll
  for (int s = 0; s < D; ++s) {
    if (lo + s < hi) cp16(&ring[s][lane], w + idx[lo + s] * (DIM / 4) + lane);
    commit();
  }
  for (long long j = lo; j < hi; j += D) {
#pragma unroll
    for (int s = 0; s < D; ++s) {
      wait_group<D - 1>();
      if (j + s < hi) add(acc, ring[s][lane]);
      if (j + s + D < hi) cp16(&ring[s][lane], w + idx[j + s + D] * (DIM / 4) + lane);
      commit();
    }
  }
  return acc;
}

// Warp g's entries: with C == 0 the ids split evenly over all warps (flat: no bags, perfect
// balance), else chunk g % splits of bag g / splits (C entries, as the `split` variants). Its sum
// goes to out[g] (no pass that adds a bag's chunks: the same bytes written by every kernel here).
template <bool RING, int D, int C, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) gather(const float4* __restrict__ w, const long long* __restrict__ idx,
                                                  const long long* __restrict__ offs, long long bags, long long n,
                                                  int splits, float4* __restrict__ out) {
  __shared__ float4 ring[RING ? WARPS : 1][RING ? D : 1][32];
  const int lane = threadIdx.x % 32;
  const long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  long long lo, hi;
  if (C == 0) {
    flat_range(g, n, lo, hi);
  } else {
    const long long bag = g / splits, chunk = g % splits;
    if (bag >= bags) return;
    const long long start = offs[bag], end = bag + 1 < bags ? offs[bag + 1] : n;
    lo = start + chunk * C;
    if (chunk > 0 && lo >= end) return;
    hi = min(end, lo + C);
  }
  out[g * 32 + lane] = RING ? sum_ring<D>(w, idx, lo, hi, ring[threadIdx.x / 32], lane) : sum_plain<D>(w, idx, lo, hi, lane);
}

// The flat gather with load hint H (see load), U rows in flight per lane.
template <int U, int H>
__global__ void __launch_bounds__(256) flat_hint(const float4* __restrict__ w, const long long* __restrict__ idx,
                                                 long long n, float4* __restrict__ out) {
  const int lane = threadIdx.x % 32;
  const long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  long long lo, hi;
  flat_range(g, n, lo, hi);
  out[g * 32 + lane] = sum_plain<U, H>(w, idx, lo, hi, lane);
}

// The flat gather's split with no ids: warp g reads rows [lo, hi) of the table in order, U in
// flight. Against the read, it shows what splitting the bytes into one stream per warp costs;
// against the gather of rows 0..n-1, what the dependent id loads cost.
template <int U>
__global__ void __launch_bounds__(256) flat_ranges(const float4* __restrict__ w, long long n, float4* __restrict__ out) {
  const int lane = threadIdx.x % 32;
  const long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  long long lo, hi;
  flat_range(g, n, lo, hi);
  float4 acc = make_float4(0, 0, 0, 0);
  for (long long j = lo; j < hi; j += U) {
    float4 x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = j + u < hi ? w[(j + u) * (DIM / 4) + lane] : make_float4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; ++u) add(acc, x[u]);
  }
  out[g * 32 + lane] = acc;
}

// The flat gather through the bulk-copy engine: each warp keeps a ring of D whole rows (512 bytes)
// in shared memory; lane 0 asks for a row with one cp.async.bulk that completes on the slot's
// mbarrier, and every lane adds its 16 bytes of the slot once the barrier's phase flips. The rows
// are added in the same order as sum_plain's (equal bits).
__device__ __forceinline__ unsigned smem(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
template <int D>
__global__ void __launch_bounds__(256) flat_bulk(const float4* __restrict__ w, const long long* __restrict__ idx,
                                                 long long n, float4* __restrict__ out) {
  __shared__ alignas(128) float4 ring[8][D][32];
  __shared__ alignas(8) unsigned long long bar[8][D];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  long long lo, hi;
  flat_range(g, n, lo, hi);
  if (lane == 0)
    for (int s = 0; s < D; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem(&bar[warp][s])));
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncwarp();
  auto issue = [&](int s, long long j) {
    if (lane != 0) return;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 512;" ::"r"(smem(&bar[warp][s])) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 512, [%2];"
                 ::"r"(smem(&ring[warp][s][0])), "l"(w + idx[j] * (DIM / 4)), "r"(smem(&bar[warp][s])) : "memory");
  };
  auto wait = [&](int s, unsigned parity) {
    asm volatile("{\n .reg .pred p;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra WAIT;\n}" ::"r"(smem(&bar[warp][s])), "r"(parity) : "memory");
  };
  for (int s = 0; s < D; ++s)
    if (lo + s < hi) issue(s, lo + s);
  float4 acc = make_float4(0, 0, 0, 0);
  unsigned parity = 0;
  for (long long j = lo; j < hi; j += D, parity ^= 1) {
#pragma unroll
    for (int s = 0; s < D; ++s) {
      if (j + s >= hi) break;
      wait(s, parity);
      add(acc, ring[warp][s][lane]);
      __syncwarp();
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      if (j + s + D < hi) issue(s, j + s + D);
    }
  }
  out[g * 32 + lane] = acc;
}

// Narrower rows (16-bit weights): rows of Q float4s (Q = 16: 128 x 16-bit, 256 B; Q = 8: 128 B),
// Q lanes per row, so that a warp gathers 32 / Q rows at once; ids split evenly (flat), U rows in
// flight per lane. Is the gather bound by bytes or by rows? (The same ids, the same weight buffer.)
// AHEAD: the ids a lane each (a coalesced load of 32, broadcast by shuffles), the next 32 loaded
// while this 32's rows are in flight, so that no id load waits in the loop. Q = 32: float32 rows.
template <int Q, int U, bool AHEAD = false>
__global__ void flat_rows(const float4* __restrict__ w, const long long* __restrict__ idx, long long n, float4* out) {
  constexpr int R = 32 / Q;
  const int lane = threadIdx.x % 32, sub = lane / Q, col = lane % Q;
  const long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  long long lo, hi;
  flat_range(g, n, lo, hi);
  float4 acc = make_float4(0, 0, 0, 0);
  if constexpr (!AHEAD) {
    for (long long j = lo + sub; j < hi; j += R * U) {
      float4 x[U];
#pragma unroll
      for (int u = 0; u < U; ++u) x[u] = j + u * R < hi ? w[idx[j + u * R] * Q + col] : make_float4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < U; ++u) add(acc, x[u]);
    }
  } else {
    long long next = lo + lane < hi ? idx[lo + lane] : 0;
    for (long long c = lo; c < hi; c += 32) {
      const long long mine = next;
      next = c + 32 + lane < hi ? idx[c + 32 + lane] : 0;
      const int count = (int)min(32LL, hi - c);
      for (int m = 0; m < count; m += R * U) {
        float4 x[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int e = m + u * R + sub;
          const long long r = __shfl_sync(0xffffffffu, mine, e & 31);
          x[u] = e < count ? w[r * Q + col] : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) add(acc, x[u]);
      }
    }
  }
  out[g * 32 + lane] = acc;
}

// ---------------------------------------------------------------- whole bags' sums (sum mode)
// out[bag] whole, as the op's forward gives it, two ways. offs holds bags + 1 entries (the end).
// The arrival counts go back to zero, as the op's do, so that launches can follow each other.

// The last of a bag's pieces to arrive adds them in order (slot(t): where piece t was written).
template <typename Slot>
__device__ __forceinline__ void combine(long long bag, int pieces, Slot slot, const float4* partials,
                                        unsigned* arrivals, float4* out, int lane) {
  __threadfence();
  __syncwarp();
  unsigned arrived = 0;
  if (lane == 0) arrived = atomicAdd(arrivals + bag, 1u);
  if (__shfl_sync(0xffffffffu, arrived, 0) != (unsigned)(pieces - 1)) return;
  __threadfence();
  if (lane == 0) arrivals[bag] = 0;
  float4 total = __ldcg(partials + slot(0) * 32 + lane);
  for (int t = 1; t < pieces; ++t) add(total, __ldcg(partials + slot(t) * 32 + lane));
  out[bag * 32 + lane] = total;
}

// As the `split` variants: a warp per chunk of C entries of one bag, partials combined in order.
template <int U, int C>
__global__ void __launch_bounds__(128) per_chunk(const float4* __restrict__ w, const long long* __restrict__ idx,
                                                 const long long* __restrict__ offs, long long bags, int splits,
                                                 float4* partials, unsigned* arrivals, float4* out) {
  const int lane = threadIdx.x % 32;
  const long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  const long long bag = g / splits, chunk = g % splits;
  if (bag >= bags) return;
  const long long start = offs[bag], end = offs[bag + 1];
  const int chunks = max(1LL, (end - start + C - 1) / C);
  if (chunk >= chunks) return;
  const long long lo = start + chunk * C, hi = chunk + 1 == chunks ? end : lo + C;
  const float4 acc = sum_plain<U>(w, idx, lo, hi, lane);
  if (chunks == 1) {
    out[bag * 32 + lane] = acc;
    return;
  }
  partials[g * 32 + lane] = acc;
  combine(bag, chunks, [&](int t) { return g - chunk + t; }, partials, arrivals, out, lane);
}

// Bag `bag` summed by a block of S warps, as the sliced `block` variants: warp s sums the s-th
// contiguous part of the bag, the parts added in order through shared memory.
template <int U, int S, int H = 0>
__device__ void sum_sliced(const float4* __restrict__ w, const long long* __restrict__ idx, long long start,
                           long long end, long long bag, float4* out) {
  __shared__ float4 part[S][32];
  const int lane = threadIdx.x % 32, s = threadIdx.x / 32;
  const long long each = (end - start + S - 1) / S, lo = min(end, start + s * each), hi = min(end, lo + each);
  part[s][lane] = sum_plain<U, H>(w, idx, lo, hi, lane);
  __syncthreads();
  if (s != 0) return;
  float4 total = part[0][lane];
  for (int t = 1; t < S; ++t) add(total, part[t][lane]);
  out[bag * 32 + lane] = total;
}

// Block i takes bag order[i]: the bags as given, or longest first (how much of the tail the order
// of the bags decides).
template <int U, int S>
__global__ void __launch_bounds__(S * 32) sliced_block(const float4* __restrict__ w, const long long* __restrict__ idx,
                                                       const long long* __restrict__ offs, const int* __restrict__ order,
                                                       float4* out) {
  const long long bag = order[blockIdx.x];
  sum_sliced<U, S>(w, idx, offs[bag], offs[bag + 1], bag, out);
}

// Longest first by dispatch order, in one kernel and with no ordering: the grid has K passes over
// the bags, and pass p keeps only the bags of length class K - 1 - p (classes of `width` entries,
// the last one open), so the long bags' blocks are dispatched first and the others exit at once.
template <int U, int S, int K, int H = 0>
__global__ void __launch_bounds__(S * 32) sliced_block_classes(const float4* __restrict__ w, const long long* __restrict__ idx,
                                                               const long long* __restrict__ offs, long long bags,
                                                               long long width, float4* out) {
  const long long pass = blockIdx.x / bags, bag = blockIdx.x % bags, start = offs[bag], end = offs[bag + 1];
  if (min((long long)K - 1, (end - start) / width) != K - 1 - pass) return;  // the whole block
  sum_sliced<U, S, H>(w, idx, start, end, bag, out);
}

// The same for rows of Q float4s (Q = 16: 16-bit rows of 128), a slice of Q lanes: S warps hold
// S * 32 / Q slices. AHEAD: each slice loads Q ids at a time, a lane each, the next Q while this
// Q's rows are in flight, and broadcasts them in its lanes.
// A row's 16 bytes and an id through the coherent path (ld.global, as code that cannot promise the
// compiler that nothing it writes aliases them gets), not the non-coherent one the loads through
// `const __restrict__` pointers take elsewhere in this file.
__device__ __forceinline__ float4 load_coherent(const float4* p) {
  float4 v;
  asm volatile("ld.global.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ long long id_coherent(const long long* p) {
  long long v;
  asm volatile("ld.global.s64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}

template <int Q, int U, int S, int K, bool AHEAD, bool NC = true>
__global__ void __launch_bounds__(S * 32) sliced_rows_classes(const float4* __restrict__ w, const long long* __restrict__ idx,
                                                              const long long* __restrict__ offs, long long bags,
                                                              long long width, float4* out) {
  constexpr int SL = S * 32 / Q;
  const long long pass = blockIdx.x / bags, bag = blockIdx.x % bags, start = offs[bag], end = offs[bag + 1];
  if (min((long long)K - 1, (end - start) / width) != K - 1 - pass) return;  // the whole block
  __shared__ float4 part[SL][Q];
  const int s = threadIdx.x / Q, col = threadIdx.x % Q, lane = threadIdx.x % 32;
  const unsigned mask = Q == 32 ? 0xffffffffu : ((1u << Q) - 1) << (lane / Q * Q);
  const long long each = (end - start + SL - 1) / SL, lo = min(end, start + s * each), hi = min(end, lo + each);
  float4 acc = make_float4(0, 0, 0, 0);
  if constexpr (!AHEAD) {
    for (long long j = lo; j < hi; j += U) {
      float4 x[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        x[u] = j + u >= hi ? make_float4(0, 0, 0, 0)
               : NC        ? w[idx[j + u] * Q + col]
                           : load_coherent(w + id_coherent(idx + j + u) * Q + col);
#pragma unroll
      for (int u = 0; u < U; ++u) add(acc, x[u]);
    }
  } else {
    long long next = lo + col < hi ? idx[lo + col] : 0;
    for (long long c = lo; c < hi; c += Q) {
      const long long mine = next;
      next = c + Q + col < hi ? idx[c + Q + col] : 0;
      const int count = (int)min((long long)Q, hi - c);
      for (int m = 0; m < count; m += U) {
        float4 x[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const long long r = __shfl_sync(mask, mine, (m + u) % Q, Q);
          x[u] = m + u < count ? w[r * Q + col] : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) add(acc, x[u]);
      }
    }
  }
  part[s][col] = acc;
  __syncthreads();
  if (s != 0) return;
  for (int t = 1; t < SL; ++t) add(acc, part[t][col]);
  out[bag * Q + col] = acc;
}

// The bags longest first, on the GPU (as an op would have to): one block counts the bags per length
// bucket (8 entries wide, the last one open) and places each bag after the longer buckets' bags;
// within a bucket the order is whatever the atomics give (it decides only which block runs when).
__global__ void order_longest(const long long* __restrict__ offs, long long bags, int* __restrict__ order) {
  constexpr int B = 64;
  __shared__ int count[B];
  const int t = threadIdx.x;
  auto bucket = [&](long long b) { return (int)min((long long)B - 1, (offs[b + 1] - offs[b]) / 8); };
  if (t < B) count[t] = 0;
  __syncthreads();
  for (long long b = t; b < bags; b += blockDim.x) atomicAdd(&count[bucket(b)], 1);
  __syncthreads();
  if (t == 0)
    for (int k = B - 1, s = 0; k >= 0; --k) {
      const int c = count[k];
      count[k] = s;
      s += c;
    }
  __syncthreads();
  for (long long b = t; b < bags; b += blockDim.x) order[atomicAdd(&count[bucket(b)], 1)] = (int)b;
}

// Flat: warp g takes entries [g * C, g * C + C) whatever the bags (every warp the same work), finds
// the bag of its first entry by a binary search over the offsets, and sums each bag's segment in
// turn: a bag inside its chunk is written whole, a piece of a longer one goes to slot 0 (the
// chunk's first segment) or 1 (its last) and the bag's pieces are combined in chunk order. Empty
// bags are left to the caller (zeros).
template <int U, int C>
__global__ void __launch_bounds__(128) flat_bags(const float4* __restrict__ w, const long long* __restrict__ idx,
                                                 const long long* __restrict__ offs, long long bags, long long n,
                                                 float4* partials, unsigned* arrivals, float4* out) {
  const int lane = threadIdx.x % 32;
  const long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
  const long long lo = g * C;
  if (lo >= n) return;
  const long long hi = min(n, lo + C);
  long long a = 0, z = bags - 1;  // the last bag starting at or before lo
  while (a < z) {
    const long long m = (a + z + 1) / 2;
    if (offs[m] <= lo) a = m; else z = m - 1;
  }
  for (long long b = a, j = lo; j < hi; ++b) {
    const long long bs = offs[b], be = offs[b + 1];
    if (be <= j) continue;  // an empty bag
    const long long seg = min(hi, be);
    const float4 acc = sum_plain<U>(w, idx, j, seg, lane);
    j = seg;
    if (bs >= lo && be <= hi) {
      out[b * 32 + lane] = acc;
      continue;
    }
    partials[(g * 2 + (bs <= lo ? 0 : 1)) * 32 + lane] = acc;
    const long long first = bs / C;
    combine(b, (int)((be - 1) / C - first + 1),
            [&](int t) { return (first + t) * 2 + (t == 0 && bs != first * C ? 1 : 0); }, partials, arrivals, out, lane);
  }
}

// ---------------------------------------------------------------- streaming read and copy
__global__ void read_all(const float4* __restrict__ a, long long n4, float* out) {
  float4 acc = make_float4(0, 0, 0, 0);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x)
    add(acc, a[i]);
  if (acc.x == 12345.f) out[0] = acc.y;
}
// The same read with U independent 16-byte loads in flight per thread (more bytes in flight per SM).
template <int U>
__global__ void read_unrolled(const float4* __restrict__ a, long long n4, float* out) {
  float4 acc = make_float4(0, 0, 0, 0);
  const long long step = (long long)gridDim.x * blockDim.x;
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  for (; i + (U - 1) * step < n4; i += U * step) {
    float4 x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = a[i + u * step];
#pragma unroll
    for (int u = 0; u < U; ++u) add(acc, x[u]);
  }
  for (; i < n4; i += step) add(acc, a[i]);
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
  float* w;
  float4 *out, *dst;
  long long *didx, *doffs;
  const long long n4 = n * 512 / 16;
  CK(cudaMalloc(&w, ROWS * DIM * 4));
  CK(cudaMalloc(&didx, n * 8));
  CK(cudaMalloc(&doffs, bags * 8));
  CK(cudaMalloc(&out, bags * 16 * 32 * 16));  // a float4 per lane of every warp or chunk
  CK(cudaMalloc(&dst, n4 * 16));
  fill<<<sms * 8, 256>>>(w, ROWS * DIM);
  CK(cudaMemcpy(didx, idx.data(), n * 8, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(doffs, offs.data(), bags * 8, cudaMemcpyHostToDevice));
  const float4* w4 = reinterpret_cast<const float4*>(w);
  const double mb = n * 512.0 / 1e6;
  auto report = [&](const char* name, float us) { printf("%-50s %8.1f us  %5.2f TB/s\n", name, us, mb / us); };

  report("stream read (same bytes)", time_us([&] { read_all<<<sms * 16, 256>>>(w4, n4, &out[0].x); }));
  report("stream copy (same bytes; TB/s of the read)", time_us([&] { copy_all<<<sms * 16, 256>>>(w4, dst, n4); }));

  for (int u : {4, 8})
    for (int bps : {4, 8, 16}) {
      char name[80];
      snprintf(name, sizeof name, "stream read U%d, %d blocks of 256 a SM", u, bps);
      auto k = u == 4 ? read_unrolled<4> : read_unrolled<8>;
      report(name, time_us([&] { k<<<sms * bps, 256>>>(w4, n4, &out[0].x); }));
    }

  // Where the gather's time over the read goes: the same flat gather (n rows of 512 bytes, perfect
  // balance) over other ids. Footprint (the table's span the ids touch: the GPU's TLBs reach only
  // part of 2.56 GB), runs of consecutive rows (DRAM pages opened for more than one row), and rows
  // in order (the gather's own cost over a read, with no randomness left).
  {
    std::vector<std::pair<const char*, std::vector<long long>>> sets;
    sets.push_back({"the problem's ids (random over 2.56 GB)", idx});
    std::vector<long long> all(ROWS);
    for (long long r = 0; r < ROWS; ++r) all[r] = r;
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<long long> distinct(all.begin(), all.begin() + n);
    sets.push_back({"distinct random rows over 2.56 GB", distinct});
    std::sort(distinct.begin(), distinct.end());
    sets.push_back({"the same rows, ascending", distinct});
    for (long long f : {4 * n, n}) {
      std::vector<long long> part;
      for (long long r : all)
        if (r < f && (long long)part.size() < n) part.push_back(r);
      char* label = new char[64];
      snprintf(label, 64, "distinct random rows over %.0f MB", f * 512.0 / 1e6);
      sets.push_back({label, part});
    }
    for (int run : {2, 4, 8, 64}) {
      std::vector<long long> starts;
      for (long long r : all)
        if (r % run == 0 && r + run <= ROWS && (long long)starts.size() * run < n) starts.push_back(r);
      std::vector<long long> ids;
      for (long long s0 : starts)
        for (int k = 0; k < run && (long long)ids.size() < n; ++k) ids.push_back(s0 + k);
      char* label = new char[64];
      snprintf(label, 64, "runs of %d rows (%d B) at random places", run, run * 512);
      sets.push_back({label, ids});
    }
    std::vector<long long> order(n);
    for (long long r = 0; r < n; ++r) order[r] = r;
    sets.push_back({"rows 0..n-1 in order (contiguous)", order});
    long long* ids;
    CK(cudaMalloc(&ids, n * 8));
    for (const auto& s : sets) {
      CK(cudaMemcpy(ids, s.second.data(), n * 8, cudaMemcpyHostToDevice));
      char name[96];
      snprintf(name, sizeof name, "flat U8, 32 warps/SM: %s", s.first);
      report(name, time_us([&] { flat_hint<8, 0><<<sms * 4, 256>>>(w4, ids, n, out); }));
      snprintf(name, sizeof name, "flat U4, 64 warps/SM: %s", s.first);
      report(name, time_us([&] { flat_hint<4, 0><<<sms * 8, 256>>>(w4, ids, n, out); }));
      for (int wps : {16, 32, 64}) {
        snprintf(name, sizeof name, "ids prefetched U8, %d warps/SM: %s", wps, s.first);
        report(name, time_us([&] { flat_rows<32, 8, true><<<sms * wps / 8, 256>>>(w4, ids, n, out); }));
      }
      snprintf(name, sizeof name, "ids prefetched U16, 16 warps/SM: %s", s.first);
      report(name, time_us([&] { flat_rows<32, 16, true><<<sms * 2, 256>>>(w4, ids, n, out); }));
    }
    {  // the prefetching gather adds the same rows in the same order: equal bits
      float4* other;
      const long long words = (long long)sms * 32 * 32 * 4;
      CK(cudaMalloc(&other, words * 4));
      CK(cudaMemcpy(ids, idx.data(), n * 8, cudaMemcpyHostToDevice));
      flat_hint<8, 0><<<sms * 4, 256>>>(w4, ids, n, out);
      flat_rows<32, 8, true><<<sms * 4, 256>>>(w4, ids, n, other);
      CK(cudaDeviceSynchronize());
      printf("ids prefetched == plain loads: %d\n", (int)same(&out[0].x, &other[0].x, words));
      CK(cudaFree(other));
    }
    CK(cudaFree(ids));
    for (int wps : {16, 32, 64}) {
      char name[96];
      snprintf(name, sizeof name, "no ids, a range of rows a warp, U8, %d warps/SM", wps);
      report(name, time_us([&] { flat_ranges<8><<<sms * wps / 8, 256>>>(w4, n, out); }));
    }
  }
  // 16-bit rows: a streaming read of as many bytes, and flat gathers at 16-64 warps per SM
  const struct { int q; void (*k[4])(const float4*, const long long*, long long, float4*); } narrow[] = {
      {16, {flat_rows<16, 1>, flat_rows<16, 4>, flat_rows<16, 2, true>, flat_rows<16, 4, true>}},
      {8, {flat_rows<8, 1>, flat_rows<8, 4>, flat_rows<8, 2, true>, flat_rows<8, 4, true>}}};
  for (const auto& r : narrow) {
    const double bytes = n * r.q * 16.0;
    auto line = [&](const char* name, float us) { printf("%-50s %8.1f us  %5.2f TB/s\n", name, us, bytes / 1e6 / us); };
    char name[80];
    snprintf(name, sizeof name, "rows of %d B: stream read (same bytes)", r.q * 16);
    line(name, time_us([&] { read_all<<<sms * 16, 256>>>(w4, n * r.q, &out[0].x); }));
    for (int u = 0; u < 4; ++u)
      for (int wps : {16, 32, 64}) {
        snprintf(name, sizeof name, "rows of %d B: flat%s U%d, %d warps/SM", r.q * 16, u > 1 ? ", ids prefetched" : "",
                 u == 2 ? 2 : u ? 4 : 1, wps);
        line(name, time_us([&] { r.k[u]<<<sms * wps / 8, 256>>>(w4, didx, n, out); }));
      }
  }

  if (getenv("WHERE_ONLY")) return 0;

  // name, kernel, warps per block, and warps per SM (flat) or entries per chunk (bags)
  using Kernel = void (*)(const float4*, const long long*, const long long*, long long, long long, int, float4*);
  struct Config { const char* name; Kernel k; int warps, size; };
  const Config configs[] = {
      {"flat plain U4", gather<false, 4, 0, 8>, 8, 16}, {"flat plain U16", gather<false, 16, 0, 8>, 8, 16},
      {"flat plain U4", gather<false, 4, 0, 8>, 8, 32}, {"flat plain U8", gather<false, 8, 0, 8>, 8, 32},
      {"flat plain U16", gather<false, 16, 0, 8>, 8, 32}, {"flat plain U8", gather<false, 8, 0, 8>, 8, 48},
      {"flat plain U4", gather<false, 4, 0, 8>, 8, 64}, {"flat plain U8", gather<false, 8, 0, 8>, 8, 64},
      {"flat cp.async S8", gather<true, 8, 0, 8>, 8, 16}, {"flat cp.async S16", gather<true, 16, 0, 4>, 4, 16},
      {"flat cp.async S8", gather<true, 8, 0, 8>, 8, 32}, {"flat cp.async S16", gather<true, 16, 0, 4>, 4, 32},
      {"flat cp.async S8", gather<true, 8, 0, 8>, 8, 48}, {"flat cp.async S8", gather<true, 8, 0, 8>, 8, 64},
      {"bags plain U4", gather<false, 4, 32, 4>, 4, 32}, {"bags plain U8", gather<false, 8, 32, 4>, 4, 32},
      {"bags cp.async S8", gather<true, 8, 32, 4>, 4, 32}, {"bags cp.async S16", gather<true, 16, 32, 4>, 4, 32},
      {"bags plain U4", gather<false, 4, 64, 4>, 4, 64}, {"bags plain U8", gather<false, 8, 64, 4>, 4, 64},
      {"bags plain U16", gather<false, 16, 64, 4>, 4, 64}, {"bags cp.async S8", gather<true, 8, 64, 4>, 4, 64},
      {"bags cp.async S16", gather<true, 16, 64, 4>, 4, 64}, {"bags cp.async S32", gather<true, 32, 64, 2>, 2, 64},
  };
  for (const Config& c : configs) {
    const bool flat = c.name[0] == 'f';
    const int splits = flat ? 1 : (maxlen + c.size - 1) / c.size;
    const long long blocks = flat ? (long long)sms * c.size / c.warps : (bags * splits + c.warps - 1) / c.warps;
    char name[80];
    snprintf(name, sizeof name, flat ? "%s, %d warps/SM" : "%s, chunks of %d, %d warps a block", c.name, c.size,
             c.warps);
    report(name, time_us([&] { c.k<<<blocks, c.warps * 32>>>(w4, didx, doffs, bags, n, splits, out); }));
  }

  // load hints and the bulk-copy engine, flat (perfect balance); each checked to give the plain
  // gather's bits first
  {
    using Flat1 = void (*)(const float4*, const long long*, long long, float4*);
    const long long words = (long long)sms * 64 * 32 * 4;
    float4* ref;
    CK(cudaMalloc(&ref, words * 4));
    const struct { const char* name; Flat1 k; int wps; } hinted[] = {
        {"flat U8, plain", flat_hint<8, 0>, 32}, {"flat U8, L2::128B", flat_hint<8, 1>, 32},
        {"flat U8, L2::256B", flat_hint<8, 2>, 32}, {"flat U8, no L1, L2::256B", flat_hint<8, 3>, 32},
        {"flat U8, no L1, L2 evict first", flat_hint<8, 4>, 32}, {"flat U4, plain", flat_hint<4, 0>, 64},
        {"flat U4, L2::256B", flat_hint<4, 2>, 64}, {"flat U16, L2::256B", flat_hint<16, 2>, 16},
        {"flat bulk copies, ring of 4 rows", flat_bulk<4>, 32}, {"flat bulk copies, ring of 8 rows", flat_bulk<8>, 16},
        {"flat bulk copies, ring of 8 rows", flat_bulk<8>, 24}, {"flat bulk copies, ring of 8 rows", flat_bulk<8>, 32},
    };
    for (const auto& c : hinted) {
      const long long blocks = (long long)sms * c.wps / 8;
      CK(cudaMemset(out, 0, words * 4));
      CK(cudaMemset(ref, 0, words * 4));
      flat_hint<1, 0><<<blocks, 256>>>(w4, didx, n, ref);
      c.k<<<blocks, 256>>>(w4, didx, n, out);
      CK(cudaDeviceSynchronize());
      char name[96];
      snprintf(name, sizeof name, "%s, %d warps/SM%s", c.name, c.wps, same(&out[0].x, &ref[0].x, words) ? "" : " (BITS DIFFER)");
      report(name, time_us([&] { c.k<<<blocks, 256>>>(w4, didx, n, out); }));
    }
    CK(cudaFree(ref));
  }

  // whole bags: the per-chunk kernel (as the `split` variants) and the flat one, both checked
  // against the sums in double on the host first
  long long* dends;
  unsigned* arrivals;
  float4 *partials, *whole;
  CK(cudaMalloc(&dends, (bags + 1) * 8));
  CK(cudaMalloc(&arrivals, bags * 4));
  CK(cudaMalloc(&partials, (n / 16 + bags * 16) * 32 * 16));
  CK(cudaMalloc(&whole, bags * 32 * 16));
  CK(cudaMemset(arrivals, 0, bags * 4));
  offs.push_back(n);
  CK(cudaMemcpy(dends, offs.data(), (bags + 1) * 8, cudaMemcpyHostToDevice));
  auto weight = [](long long i) {
    unsigned long long h = (unsigned long long)i * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    return (double)(float)((float)(h % 2001) / 1000.f - 1.f);
  };
  std::vector<double> want(bags * DIM, 0.0);
  for (long long b = 0; b < bags; ++b)
    for (long long j = offs[b]; j < offs[b + 1]; ++j)
      for (int f = 0; f < DIM; ++f) want[b * DIM + f] += weight(idx[j] * DIM + f);
  auto check = [&](const char* name) {
    std::vector<float> got(bags * DIM);
    CK(cudaMemcpy(got.data(), whole, bags * DIM * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (long long i = 0; i < bags * DIM; ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / std::max(1.0, std::abs(want[i])));
    if (worst > 1e-4) {
      printf("%s: WRONG, error %.3g\n", name, worst);
      exit(1);
    }
  };
  using Bags = void (*)(const float4*, const long long*, const long long*, long long, int, float4*, unsigned*, float4*);
  using Flat = void (*)(const float4*, const long long*, const long long*, long long, long long, float4*, unsigned*, float4*);
  const struct { const char* name; Bags k; int chunk, unroll; } chunked[] = {
      {"per chunk + combine", per_chunk<4, 32>, 32, 4}, {"per chunk + combine", per_chunk<8, 32>, 32, 8},
      {"per chunk + combine", per_chunk<4, 64>, 64, 4}, {"per chunk + combine", per_chunk<8, 64>, 64, 8}};
  const struct { const char* name; Flat k; int chunk, unroll; } flats[] = {
      {"flat + combine", flat_bags<4, 32>, 32, 4}, {"flat + combine", flat_bags<8, 32>, 32, 8},
      {"flat + combine", flat_bags<4, 64>, 64, 4}, {"flat + combine", flat_bags<8, 64>, 64, 8},
      {"flat + combine", flat_bags<8, 128>, 128, 8}};
  // each kernel checked first (empty bags: zeros, which the flat kernel leaves to its caller), then timed
  auto measure = [&](const char* label, int chunk, int unroll, auto run) {
    CK(cudaMemset(whole, 0, bags * 32 * 16));
    run();
    CK(cudaDeviceSynchronize());
    check(label);
    char name[128];
    if (chunk)
      snprintf(name, sizeof name, "%s, chunks of %d, U%d", label, chunk, unroll);
    else
      snprintf(name, sizeof name, "%s, U%d", label, unroll);
    report(name, time_us(run));
  };
  for (const auto& c : chunked) {
    const int splits = (maxlen + c.chunk - 1) / c.chunk;
    measure(c.name, c.chunk, c.unroll, [&] {
      c.k<<<(bags * splits + 3) / 4, 128>>>(w4, didx, dends, bags, splits, partials, arrivals, whole);
    });
  }
  for (const auto& c : flats) {
    const long long warps = (n + c.chunk - 1) / c.chunk;
    measure(c.name, c.chunk, c.unroll, [&] { c.k<<<(warps + 3) / 4, 128>>>(w4, didx, dends, bags, n, partials, arrivals, whole); });
  }

  // a block per bag as slices, the bags in their order and longest first (the order sorted here,
  // on the host: an upper bound on what ordering the bags could gain)
  std::vector<int> given(bags), longest(bags);
  for (int b = 0; b < (int)bags; ++b) given[b] = longest[b] = b;
  std::stable_sort(longest.begin(), longest.end(),
                   [&](int a, int b) { return offs[a + 1] - offs[a] > offs[b + 1] - offs[b]; });
  int *dgiven, *dlongest;
  CK(cudaMalloc(&dgiven, bags * 4));
  CK(cudaMalloc(&dlongest, bags * 4));
  CK(cudaMemcpy(dgiven, given.data(), bags * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dlongest, longest.data(), bags * 4, cudaMemcpyHostToDevice));
  using Sliced = void (*)(const float4*, const long long*, const long long*, const int*, float4*);
  const struct { Sliced k; int warps, unroll; } sliced[] = {
      {sliced_block<4, 2>, 2, 4}, {sliced_block<8, 2>, 2, 8}, {sliced_block<4, 4>, 4, 4}, {sliced_block<4, 8>, 8, 4}};
  for (const auto& c : sliced)
    for (const int* order : {dgiven, dlongest}) {
      char label[80];
      snprintf(label, sizeof label, "block of %d sliced warps, %s", c.warps, order == dgiven ? "bags in order" : "longest first");
      measure(label, 0, c.unroll, [&] { c.k<<<bags, c.warps * 32>>>(w4, didx, dends, order, whole); });
    }

  // the same longest first with the order made on the GPU, both kernels timed
  int* dorder;
  CK(cudaMalloc(&dorder, bags * 4));
  measure("block of 8 sliced warps, longest first ordered on the GPU (two kernels)", 0, 4, [&] {
    order_longest<<<1, 1024>>>(dends, bags, dorder);
    sliced_block<4, 8><<<bags, 256>>>(w4, didx, dends, dorder, whole);
  });
  report("the ordering kernel alone", time_us([&] { order_longest<<<1, 1024>>>(dends, bags, dorder); }));
  // longest first by dispatch order: K passes of the grid over the bags, each keeping one length
  // class (2 x the mean length split into K classes, the last one open), one kernel
  const long long mean = (n + bags - 1) / bags;
  using Classes = void (*)(const float4*, const long long*, const long long*, long long, long long, float4*);
  const struct { Classes k; int warps, passes; const char* hint = ""; } classes[] = {
      {sliced_block_classes<4, 8, 2>, 8, 2}, {sliced_block_classes<4, 8, 4>, 8, 4}, {sliced_block_classes<4, 8, 8>, 8, 8},
      {sliced_block_classes<4, 4, 2>, 4, 2}, {sliced_block_classes<4, 4, 4>, 4, 4},
      {sliced_block_classes<4, 8, 4, 2>, 8, 4, ", L2::256B"}, {sliced_block_classes<4, 4, 4, 2>, 4, 4, ", L2::256B"},
      {sliced_block_classes<4, 8, 4, 4>, 8, 4, ", L2 evict first"}};
  for (const auto& c : classes) {
    char label[96];
    snprintf(label, sizeof label, "block of %d sliced warps, %d length classes, longest first%s", c.warps, c.passes, c.hint);
    const long long width = std::max(1LL, 2 * mean / c.passes);
    measure(label, 0, 4, [&] { c.k<<<bags * c.passes, c.warps * 32>>>(w4, didx, dends, bags, width, whole); });
  }

  // Whole bags of 16-bit rows (Q float4s a row) in sliced blocks, longest first by 4 classes,
  // checked against double sums; and the float32 rows with the ids loaded ahead
  {
    using Rows = void (*)(const float4*, const long long*, const long long*, long long, long long, float4*);
    const struct { int q; Rows k; int warps, unroll; bool ahead; int passes; const char* note = ""; } narrow_bags[] = {
        {16, sliced_rows_classes<16, 1, 4, 1, false>, 4, 1, false, 1}, {16, sliced_rows_classes<16, 1, 4, 4, false>, 4, 1, false, 4},
        {16, sliced_rows_classes<16, 1, 4, 4, false, false>, 4, 1, false, 4, " (coherent loads)"},
        {16, sliced_rows_classes<16, 1, 8, 1, false>, 8, 1, false, 1},
        {16, sliced_rows_classes<16, 1, 8, 1, false, false>, 8, 1, false, 1, " (coherent loads)"},
        {32, sliced_rows_classes<32, 4, 4, 4, false, false>, 4, 4, false, 4, " (coherent loads)"},
        {16, sliced_rows_classes<16, 4, 4, 4, false>, 4, 4, false, 4}, {16, sliced_rows_classes<16, 2, 4, 4, true>, 4, 2, true, 4},
        {16, sliced_rows_classes<16, 4, 4, 4, true>, 4, 4, true, 4}, {16, sliced_rows_classes<16, 4, 8, 4, true>, 8, 4, true, 4},
        {16, sliced_rows_classes<16, 4, 2, 4, true>, 2, 4, true, 4}, {16, sliced_rows_classes<16, 8, 4, 4, true>, 4, 8, true, 4},
        {32, sliced_rows_classes<32, 4, 8, 4, false>, 8, 4, false, 4}, {32, sliced_rows_classes<32, 4, 8, 4, true>, 8, 4, true, 4},
        {32, sliced_rows_classes<32, 8, 4, 4, true>, 4, 8, true, 4}, {32, sliced_rows_classes<32, 4, 4, 4, false>, 4, 4, false, 4}};
    for (const auto& c : narrow_bags) {
      const int q = c.q;
      std::vector<double> want_q(bags * q * 4, 0.0);
      for (long long b = 0; b < bags; ++b)
        for (long long j = offs[b]; j < offs[b + 1]; ++j)
          for (int f = 0; f < q * 4; ++f) want_q[b * q * 4 + f] += weight(idx[j] * q * 4 + f);
      CK(cudaMemset(whole, 0, bags * 32 * 16));
      const long long width = std::max(1LL, 2 * mean / c.passes);
      auto run = [&] { c.k<<<bags * c.passes, c.warps * 32>>>(w4, didx, dends, bags, width, whole); };
      run();
      CK(cudaDeviceSynchronize());
      std::vector<float> got(bags * q * 4);
      CK(cudaMemcpy(got.data(), whole, bags * q * 4 * 4, cudaMemcpyDeviceToHost));
      double worst = 0;
      for (long long i = 0; i < bags * q * 4; ++i) worst = std::max(worst, std::abs(got[i] - want_q[i]) / std::max(1.0, std::abs(want_q[i])));
      char name[128];
      snprintf(name, sizeof name, "rows of %d B: block of %d warps, %d slices, %s, U%d%s%s", q * 16, c.warps, c.warps * 32 / q,
               c.passes > 1 ? "4 length classes" : "bags in order", c.unroll, c.ahead ? ", ids ahead" : "", c.note);
      if (worst > 1e-4) {
        printf("%s: WRONG, error %.3g\n", name, worst);
        exit(1);
      }
      const float us = time_us(run);
      printf("%-50s %8.1f us  %5.2f TB/s\n", name, us, n * q * 16.0 / 1e6 / us);
    }
  }

  // the ring adds the same rows in the same order as plain loads: equal bits, flat and per chunk
  float4* other;
  CK(cudaMalloc(&other, bags * 16 * 32 * 16));
  const long long words = bags * 16 * 32 * 4;
  CK(cudaMemset(out, 0, words * 4));
  CK(cudaMemset(other, 0, words * 4));
  gather<false, 4, 0, 8><<<sms * 4, 256>>>(w4, didx, doffs, bags, n, 1, out);
  gather<true, 8, 0, 8><<<sms * 4, 256>>>(w4, didx, doffs, bags, n, 1, other);
  const bool flat_same = same(&out[0].x, &other[0].x, words);
  const int splits = (maxlen + 63) / 64;
  gather<false, 1, 64, 4><<<(bags * splits + 3) / 4, 128>>>(w4, didx, doffs, bags, n, splits, out);
  gather<true, 16, 64, 4><<<(bags * splits + 3) / 4, 128>>>(w4, didx, doffs, bags, n, splits, other);
  printf("cp.async ring == plain loads: flat %d, per chunk %d\n", (int)flat_same, (int)same(&out[0].x, &other[0].x, words));
  CK(cudaDeviceSynchronize());
  return 0;
}
