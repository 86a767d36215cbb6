// The C ABI of cross_entropy's variants, rendered from its declaration (tuner/build/declared.py): do
// not edit; `python -m tuner.build.declared cross_entropy` writes it again.
#pragma once
#include <cuda_runtime_api.h>

#define TUNER_CROSS_ENTROPY_ABI 2

// Bad input the forward reports, by bit (a kernel calls
// tuner_cross_entropy_report(errors, error_flags, TUNER_CROSS_ENTROPY_ERROR_<NAME>)).
#define TUNER_CROSS_ENTROPY_ERROR_BAD_TARGET 0  // a target is outside [0, vocab) and is not ignore_index

// The forward's arguments: input tensors, outputs (allocated by the op), saved tensors, scalars, sizes.
typedef struct {
  const void* logits;
  const void* target;
  void* loss;
  void* lse;  // saved for the backward
  void* count;  // saved for the backward
  void* gradient;  // saved for the backward
  long long ignore_index;
  float label_smoothing;
  int reduction;  // 0 none, 1 mean, 2 sum
  int in_place;
  long long rows;  // leading(logits)
  long long vocab;  // logits.size(-1)
  unsigned* errors;            // the sticky error word (bit i: error i), zeroed until the host takes it
  unsigned char* error_flags;  // host-mapped bytes, one an error, or null: the host's view without a copy
} TunerCrossEntropyArgs;

#ifdef __CUDACC__
// Reports error `bit` of a call: sets it in the sticky word and, the first time since the host
// took it, its host flag (a batch full of bad input costs one write over the bus). A kernel
// passes on the forward's `errors` and `error_flags`.
__device__ __forceinline__ void tuner_cross_entropy_report(unsigned* errors, unsigned char* error_flags, int bit) {
  const unsigned mask = 1u << bit;
  if (errors != nullptr && !(atomicOr(errors, mask) & mask) && error_flags != nullptr) {
    volatile unsigned char* flags = error_flags;
    flags[bit] = 1;
    __threadfence_system();
  }
}
#endif

// The backward's: each output's gradient, the inputs, the saved tensors, each input's gradient
// (null where none is wanted, e.g. a frozen weight), scalars, sizes.
typedef struct {
  const void* grad_loss;
  const void* logits;
  const void* target;
  const void* lse;
  const void* count;
  const void* gradient;
  void* grad_logits;
  long long ignore_index;
  float label_smoothing;
  int reduction;  // 0 none, 1 mean, 2 sum
  int in_place;
  long long rows;
  long long vocab;
} TunerCrossEntropyBackwardArgs;

// A variant's table: what `tuner_cross_entropy_vtable()` returns.
typedef struct {
  int abi;
  const char* name;
  const char* logits_dtype;  // c10's name of the dtype it takes ("BFloat16")
  int validates;  // 1: its forward reports the errors above
  int (*forward)(const TunerCrossEntropyArgs* args, cudaStream_t stream);
  int (*backward)(const TunerCrossEntropyBackwardArgs* args, cudaStream_t stream);
} TunerCrossEntropyVtable;
