// The guard in front of torch's op (a declaration's `guards`): what the binding hands the one kernel
// of templates/common/tuner_guard.cu, which checks every part's integer entries and copies them.
#pragma once
#include <cuda_runtime_api.h>

#define TUNER_GUARD_PARTS 4

struct TunerGuardPart {
  const void* in;  // n entries of `bytes` (4 or 8) each, contiguous
  void* out;       // their copy, entries outside [0, bound) clamped into it
  long long n;
  long long bound;
  long long allowed;  // a value also accepted, where has_allowed (an ignore_index)
  int bytes;
  int ascending;  // an entry below the one before it is bad too
  int has_allowed;
  unsigned bit;  // the error bit a bad entry reports
};

struct TunerGuardParts {
  TunerGuardPart part[TUNER_GUARD_PARTS];
  int count;
};

// One launch over every part on `stream`; `word`: the op's error word, `flags`: its host-mapped
// flags (a byte per bit), `scratch`: two zeroed words of the stream's workspace, left zeroed.
// Returns a cudaError_t.
__attribute__((visibility("hidden"))) int tuner_guard(const TunerGuardParts& parts, unsigned* word,
                                                      unsigned char* flags, unsigned* scratch, cudaStream_t stream);
