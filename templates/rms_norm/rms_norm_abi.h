// The C ABI of rms_norm's variants, rendered from its declaration (tuner/build/declared.py): do
// not edit; `python -m tuner.build.declared rms_norm` writes it again.
#pragma once
#include <cuda_runtime_api.h>

#define TUNER_RMS_NORM_ABI 1

// The forward's arguments: input tensors, outputs (allocated by the op), saved tensors, scalars, sizes.
typedef struct {
  const void* x;
  const void* weight;
  void* y;
  void* rstd;  // saved for the backward
  float eps;
  long long rows;  // leading(x)
  long long width;  // x.size(-1)
} TunerRmsNormArgs;

// The backward's: each output's gradient, the inputs, the saved tensors, each input's gradient
// (null where none is wanted, e.g. a frozen weight), scalars, sizes.
typedef struct {
  const void* grad_y;
  const void* x;
  const void* weight;
  const void* rstd;
  void* grad_x;
  void* grad_weight;
  float* scratch;  // vt->scratch_floats(sizes[0], sizes[1]) floats, any contents
  float eps;
  long long rows;
  long long width;
} TunerRmsNormBackwardArgs;

// A variant's table: what `tuner_rms_norm_vtable()` returns.
typedef struct {
  int abi;
  const char* name;
  const char* x_dtype;  // c10's name of the dtype it takes ("BFloat16")
  const char* weight_dtype;  // c10's name of the dtype it takes ("BFloat16")
  int saves_rstd;
  long long (*scratch_floats)(long long rows, long long width);
  int (*forward)(const TunerRmsNormArgs* args, cudaStream_t stream);
  int (*backward)(const TunerRmsNormBackwardArgs* args, cudaStream_t stream);
} TunerRmsNormVtable;
