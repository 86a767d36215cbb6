// The C ABI of scale_add's variants, rendered from its declaration (tuner/build/declared.py): do
// not edit; `python -m tuner.build.declared scale_add` writes it again.
#pragma once
#include <cuda_runtime_api.h>

#define TUNER_SCALE_ADD_ABI 1

// The forward's arguments: input tensors, outputs (allocated by the op), saved tensors, scalars, sizes.
typedef struct {
  const void* x;
  const void* y;
  void* out;
  float alpha;
  long long n;  // x.numel()
} TunerScaleAddArgs;

// The backward's: each output's gradient, the inputs, the saved tensors, each input's gradient
// (null where none is wanted, e.g. a frozen weight), scalars, sizes.
typedef struct {
  const void* grad_out;
  const void* x;
  const void* y;
  void* grad_x;
  void* grad_y;
  float alpha;
  long long n;
} TunerScaleAddBackwardArgs;

// A variant's table: what `tuner_scale_add_vtable()` returns.
typedef struct {
  int abi;
  const char* name;
  int (*forward)(const TunerScaleAddArgs* args, cudaStream_t stream);
  int (*backward)(const TunerScaleAddBackwardArgs* args, cudaStream_t stream);
} TunerScaleAddVtable;
