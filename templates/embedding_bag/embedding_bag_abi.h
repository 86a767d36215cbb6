// The C interface every EmbeddingBag variant exports (no torch headers: a variant
// compiles in about 2 s). Indices are 1-D; bags are given by offsets as the user gave them
// (bags or bags + 1 of them) or, for 2-D indices, by a fixed bag length, so that a call
// launches nothing but the variant's kernels.
#pragma once
#include <cuda_runtime_api.h>

#define TUNER_EMBEDDING_BAG_ABI 4

// Error bits of the sticky error word; flags[i] mirrors bit i in host-mapped memory.
#define TUNER_EB_BAD_INDEX 1u   // an index outside [0, rows)
#define TUNER_EB_BAD_OFFSET 2u  // offsets decreasing or outside [0, n]
#define TUNER_EB_ERROR_BITS 2

enum { TUNER_EB_SUM = 0, TUNER_EB_MEAN = 1, TUNER_EB_MAX = 2 };

typedef struct {
  const void* weight;              // [rows, dim], the variant's weight dtype
  const void* indices;             // [n], the variant's index dtype
  const void* offsets;             // index dtype; bag b is [offsets[b], offsets[b + 1]), the last one
                                   // ending at n unless offsets_end
  const void* per_sample_weights;  // [n] weight dtype, or null (sum only)
  void* out;                       // [bags, dim] weight dtype
  long long* max_indices;          // [bags, dim] for max (-1 in empty bags), or null
  float* bag_count;                // [bags]: entries counted per bag (padding left out), or null
  long long rows, dim, bags, n;
  long long bag_length;            // >= 0: bag b is [b * bag_length, (b + 1) * bag_length), offsets unused
  int offsets_end;                 // offsets hold bags + 1 entries (include_last_offset), else bags
  int mode;                        // TUNER_EB_SUM / MEAN / MAX
  long long padding_idx;           // -1: none
  unsigned* error_word;            // device word, sticky error bits (zeroed by the host)
  unsigned char* error_flags;      // host-mapped bytes, one per bit, or null
  // Variants that split bags into chunks (split > 0 in the table): groups per bag, and when
  // that is more than one, the chunks' scratch and a zeroed counter per bag (left zeroed).
  long long splits;
  float* partials;                 // [bags * splits, dim]
  long long* partial_args;         // [bags * splits, dim] (max)
  long long* partial_counts;       // [bags * splits]
  unsigned* arrivals;              // [bags]
} TunerEmbeddingBagArgs;

// The backward: the dense gradient of weight (zeroed by the host) and, for sum with
// per_sample_weights, their gradient. Entries out of range or equal to padding_idx add
// nothing. Variants with `sorted` set need the indices sorted by the host (stable),
// with their original positions, and two scratch buffers.
typedef struct {
  const void* grad_out;            // [bags, dim] weight dtype
  const void* weight;              // [rows, dim] (for the gradient of per_sample_weights)
  const void* indices;             // [n] index dtype
  const void* offsets;             // as in TunerEmbeddingBagArgs
  const void* per_sample_weights;  // [n] or null
  const long long* max_indices;    // [bags, dim] from the forward (max)
  const float* bag_count;          // [bags] from the forward (mean)
  const long long* sorted_rows;    // [n] indices sorted, stable (sorted variants)
  const long long* order;          // [n] position in `indices` of each sorted entry
  long long* bag_of;               // [n] scratch: the bag of each position (-1 set by the host)
  float* partials;                 // [ceil(n / piece), dim] scratch
  void* grad_weight;               // [rows, dim] weight dtype, or null (not wanted)
  void* grad_per_sample_weights;   // [n] weight dtype, or null
  long long rows, dim, bags, n;
  long long bag_length;
  int offsets_end;
  int mode;
  long long padding_idx;
} TunerEmbeddingBagBackwardArgs;

typedef struct {
  int abi;
  const char* name;
  const char* weight_dtype;  // torch's names: "Float", "Half", "BFloat16"
  const char* index_dtype;   // "Long", "Int"
  int vec;                   // feature elements per load (rows must be aligned to vec elements)
  int validates;             // whether bad indices and offsets are reported (else only clamped)
  int sorted;                // whether the backward needs sorted_rows / order / bag_of / partials
  int piece;                 // sorted entries summed per partial (partials has ceil(n / piece) rows)
  int split;                 // entries per chunk when bags are split over groups (0: a group per bag)
  int (*forward)(const TunerEmbeddingBagArgs* a, cudaStream_t stream);
  int (*backward)(const TunerEmbeddingBagBackwardArgs* a, cudaStream_t stream);
} TunerEmbeddingBagVtable;
