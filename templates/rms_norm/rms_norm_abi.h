// The C interface every RMSNorm variant exports (CUDA headers only: a variant compiles in
// seconds; the torch binding, rms_norm_op.cpp, calls any variant through this table).
#pragma once
#include <cuda_runtime_api.h>

#define TUNER_RMS_NORM_ABI 1

typedef struct {
  const void* x;       // [rows, width], x dtype
  const void* weight;  // [width], weight dtype
  void* y;             // [rows, width], promote(x, weight) dtype
  float* rstd;         // [rows] 1 / rms, written when not null
  long long rows, width;
  float eps;
} TunerRmsNormArgs;

typedef struct {
  const void* grad_y;  // [rows, width], y's dtype
  const void* x;
  const void* weight;
  const float* rstd;   // from the forward, or null
  void* grad_x;        // [rows, width], x dtype, or null: not wanted
  void* grad_weight;   // [width], weight dtype, or null: not wanted
  float* scratch;      // scratch_floats(rows, width) floats, any contents
  long long rows, width;
  float eps;
} TunerRmsNormBackwardArgs;

typedef struct {
  int abi;
  const char* name;
  const char* x_dtype;       // c10 ScalarType names, e.g. "BFloat16"
  const char* weight_dtype;
  int saves_rstd;            // 1: the backward reads 1/rms saved by the forward
  int (*forward)(const TunerRmsNormArgs*, cudaStream_t);
  int (*backward)(const TunerRmsNormBackwardArgs*, cudaStream_t);
  long long (*scratch_floats)(long long rows, long long width);
} TunerRmsNormVtable;
