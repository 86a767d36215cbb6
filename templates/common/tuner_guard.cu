// The guard in front of torch's op (a declaration's `guards`): one pass over an integer input that
// reports entries outside [0, bound) (or below the entry before them) the way a validating variant
// does, and writes a copy with those entries clamped into range for torch's op to read. Part of a
// binding with guards, compiled by nvcc to PTX of the oldest architecture CUDA 13 targets, so that the
// binding stays one library for every GPU (the driver compiles it once, on first use).
#include <cuda_runtime.h>

namespace {

template <class I>
__global__ void tuner_guard_kernel(const I* in, I* out, long long n, long long bound, bool ascending,
                                   unsigned* word, unsigned char* flag, unsigned bit) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  bool bad = false;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const long long v = static_cast<long long>(in[i]);
    const bool outside = v < 0 || v >= bound;
    bad |= outside || (ascending && i > 0 && v < static_cast<long long>(in[i - 1]));
    out[i] = static_cast<I>(outside ? (v < 0 ? 0 : bound - 1) : v);
  }
  // Only the first report of the bit since the host cleared the word goes to host memory.
  if (__syncthreads_or(bad) && threadIdx.x == 0 && !(atomicOr(word, 1u << bit) & (1u << bit))) {
    volatile unsigned char* flags = flag;
    flags[bit] = 1;
    __threadfence_system();
  }
}

}  // namespace

// `in` (4- or 8-byte integers, n of them) checked and copied to `out`; `word`, the op's error word,
// `flags`, its host-mapped flags; a cudaError_t.
__attribute__((visibility("hidden"))) int tuner_guard(const void* in, void* out, int bytes, long long n,
                                                      long long bound, bool ascending, unsigned* word,
                                                      unsigned char* flags, unsigned bit, cudaStream_t stream) {
  if (n <= 0) return 0;
  const int threads = 256;
  const long long wanted = (n + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(wanted < 1024 ? wanted : 1024);
  if (bytes == 8)
    tuner_guard_kernel<<<blocks, threads, 0, stream>>>(static_cast<const long long*>(in), static_cast<long long*>(out),
                                                         n, bound, ascending, word, flags, bit);
  else
    tuner_guard_kernel<<<blocks, threads, 0, stream>>>(static_cast<const int*>(in), static_cast<int*>(out), n, bound,
                                                         ascending, word, flags, bit);
  return static_cast<int>(cudaGetLastError());
}
