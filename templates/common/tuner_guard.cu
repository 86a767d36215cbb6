// The guard in front of torch's op (a declaration's `guards`; tuner_guard.h): one pass over the
// call's integer inputs that reports entries outside [0, bound) (an allowed value aside) or below
// the entry before them, the way a validating variant does, and writes copies with those entries
// clamped into range for torch's op to read. Compiled into the binding as PTX of the oldest
// architecture CUDA 13 targets, so that the binding stays one library for every GPU (the driver
// compiles it once, on first use).
#include "tuner_guard.h"

namespace {

__device__ __forceinline__ long long entry(const TunerGuardPart& p, long long i) {
  return p.bytes == 8 ? static_cast<const long long*>(p.in)[i] : static_cast<long long>(static_cast<const int*>(p.in)[i]);
}

__global__ void tuner_guard_kernel(TunerGuardParts parts, long long total, unsigned* word, unsigned char* flags,
                                   unsigned* scratch) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  unsigned bad = 0;
  bool disordered = false;  // an "ascending" part's entry below the one before it
  for (long long g = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; g < total; g += stride) {
    long long i = g;
    int k = 0;
    while (k < parts.count - 1 && i >= parts.part[k].n) i -= parts.part[k++].n;
    const TunerGuardPart& p = parts.part[k];
    const long long v = entry(p, i);
    const bool outside = (v < 0 || v >= p.bound) && !(p.has_allowed && v == p.allowed);
    const bool below = p.ascending && i > 0 && v < entry(p, i - 1);
    if (outside || below) bad |= 1u << p.bit;
    disordered |= below;
    const long long kept = outside ? (v < 0 ? 0 : p.bound - 1) : v;
    if (p.bytes == 8)
      static_cast<long long*>(p.out)[i] = kept;
    else
      static_cast<int*>(p.out)[i] = static_cast<int>(kept);
  }
  if (bad) {  // only the first report of a bit since the host cleared the word goes to host memory
    const unsigned fresh = bad & ~atomicOr(word, bad);
    if (fresh) {
      volatile unsigned char* flag = flags;
      for (int b = 0; b < 8; ++b)
        if (fresh & (1u << b)) flag[b] = 1;
      __threadfence_system();
    }
  }
  // Clamping alone cannot put disordered entries in order (torch asserts that offsets never
  // decrease): the last block to finish, seeing any, writes such a part's copy as zeros (every
  // bag empty but the last), then leaves the two scratch words zeroed for the next launch.
  __shared__ bool last;
  if (__syncthreads_or(disordered) && threadIdx.x == 0) atomicOr(scratch + 1, 1u);
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(scratch, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (*static_cast<volatile unsigned*>(scratch + 1)) {
    for (int k = 0; k < parts.count; ++k) {
      const TunerGuardPart& p = parts.part[k];
      if (!p.ascending) continue;
      for (long long i = threadIdx.x; i < p.n; i += blockDim.x) {
        if (p.bytes == 8)
          static_cast<long long*>(p.out)[i] = 0;
        else
          static_cast<int*>(p.out)[i] = 0;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) scratch[0] = scratch[1] = 0;
}

}  // namespace

int tuner_guard(const TunerGuardParts& parts, unsigned* word, unsigned char* flags, unsigned* scratch,
                cudaStream_t stream) {
  long long total = 0;
  for (int k = 0; k < parts.count; ++k) total += parts.part[k].n;
  if (total <= 0) return 0;
  const int threads = 256;
  const long long wanted = (total + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(wanted < 1024 ? wanted : 1024);
  tuner_guard_kernel<<<blocks, threads, 0, stream>>>(parts, total, word, flags, scratch);
  return static_cast<int>(cudaGetLastError());
}
