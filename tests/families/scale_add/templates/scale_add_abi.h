// The C table a scale_add variant exports.
#pragma once
#include <cuda_runtime_api.h>

#define TUNER_SCALE_ADD_ABI 1

typedef struct {
  int abi;
  const char* name;
  int (*launch)(const float* x, const float* y, float* out, float alpha, long long n, cudaStream_t stream);
} TunerScaleAddVtable;
