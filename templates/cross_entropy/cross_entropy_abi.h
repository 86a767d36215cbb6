// The C ABI of cross_entropy's variants, rendered from its declaration (tuner/build/declared.py): do
// not edit; `python -m tuner.build.declared cross_entropy` writes it again.
#pragma once
#include <cuda_runtime_api.h>

#define TUNER_CROSS_ENTROPY_ABI 1

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
} TunerCrossEntropyArgs;

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
  int (*forward)(const TunerCrossEntropyArgs* args, cudaStream_t stream);
  int (*backward)(const TunerCrossEntropyBackwardArgs* args, cudaStream_t stream);
} TunerCrossEntropyVtable;
