// The C interface between a rendered GIoU variant (CUDA headers only) and the
// torch binding, which is compiled once and calls any variant through this table.
#pragma once
#include <cuda_runtime_api.h>

#define TUNER_GIOU_ABI 2

// Error bits a variant's validation sets in the workspace's error word.
#define TUNER_GIOU_BAD_COUNT 1u   // num_boxes outside [0, S]
#define TUNER_GIOU_BAD_TARGET 2u  // non-finite coordinate in a valid target box
#define TUNER_GIOU_ERROR_BITS 2

// Workspace layout, in 32-bit words. It must start zeroed; each forward leaves it
// zeroed again except for the error word, which stays set until the host clears it.
enum {
  TUNER_GIOU_WS_TICKET = 0,   // blocks finished, for last-block-does-the-rest
  TUNER_GIOU_WS_ERROR = 1,    // sticky error bits
  TUNER_GIOU_WS_SUM = 2,      // float: running sum (atomic reduction)
  TUNER_GIOU_WS_COUNT = 3,    // running count of valid boxes (atomic reduction)
  TUNER_GIOU_WS_PARTIALS = 4  // per-block sums then counts (two_pass reduction)
};

typedef struct {
  const void* pred;            // [B, S, 4] pred dtype
  const void* target;          // [B, S, 4] target dtype
  const long long* num_boxes;  // [B] int64, or null: valid iff target y2 > 0
  int B, S;
  int reduction;               // 0 none, 1 mean, 2 sum
  float eps;
  float* out;                  // [B, S] for none, else [1]
  float* count_out;            // [1] number of valid boxes (0 for reduction none), or null
  float* saved_grad;           // [B, S, 4] float, d loss_i / d pred, or null (fused backward only)
  unsigned* workspace;
  // Host-mapped flags, one byte per error bit (byte i for bit 1 << i), or null. The
  // launch that first sets a bit in the workspace's sticky error word also sets its
  // byte here, so the host sees bad input with a plain load: no copy, no sync.
  unsigned char* error_flags;
} TunerGiouArgs;

typedef struct {
  const void* pred;
  const void* target;
  const long long* num_boxes;
  int B, S;
  int reduction;
  float eps;
  const float* grad_out;       // [B, S] for none, else [1]
  const float* count;          // [1] from the forward
  const float* saved_grad;     // from the forward (fused backward only)
  void* grad_pred;             // [B, S, 4] pred dtype
} TunerGiouBackwardArgs;

typedef struct {
  int abi;
  const char* name;
  const char* pred_dtype;    // c10 ScalarType names the variant was rendered for, e.g. "BFloat16"
  const char* target_dtype;
  int alignment;   // bytes every pointer of pred, target and grad_pred must be aligned to
  int saves_grad;  // 1: forward must get saved_grad when a backward will follow
  int validates;   // 1: the forward sets error bits on bad input (validation is not "none")
  int (*forward)(const TunerGiouArgs*, cudaStream_t);
  int (*backward)(const TunerGiouBackwardArgs*, cudaStream_t);
  long long (*workspace_words)(int B, int S);
} TunerGiouVtable;
