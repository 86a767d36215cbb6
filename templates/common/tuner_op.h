// What every family's op needs besides its schema, its input checks and its autograd, once:
// the winners bound at load (one list per dtype pair, the nearest tuned shape per call; where
// the op has a baseline, torch's own op, the calls no variant was tuned to beat), the
// per-stream error workspace, the three validate modes, calls served by the CPU reference,
// and the binding's control ops (stage, publish, set_check, take_errors, ...). A family's op
// source holds one `tuner_op::Op<ItsVtable>` and names it in TUNER_OP_CONTROL. Header-only;
// tuner/binding.py puts this folder on each binding's include path.
#pragma once
#include "tuner_binding.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tuner_guard.h"

namespace tuner_op {

using tuner_binding::capturing;
using tuner_binding::raise_input_error;
using tuner_binding::RelaxedCapture;
using tuner_binding::text;
using tuner_binding::warn;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// How bad input that a variant's validation finds reaches the host (tuner.runtime.VALIDATE).
enum Check : int64_t {
  CHECK_DEFERRED = 0,  // left in the workspace until take_errors()
  CHECK_SYNC = 1,      // read after the launch (a stream sync; only when the variant validates)
  CHECK_ASYNC = 2,     // raised by a later call once the kernel's flag has landed (no sync, no copy)
};

// torch's spelling of a dtype in messages ("torch.float32"), as the Python API prints it.
inline std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return "torch.float64";
    case at::kFloat: return "torch.float32";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kByte: return "torch.uint8";
    case at::kChar: return "torch.int8";
    case at::kShort: return "torch.int16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    default: return std::string("torch.") + c10::toString(t);
  }
}

// A dtype's position in a family's list of supported dtypes, by type or by c10 name
// ("BFloat16", as a variant's table names its dtypes); -1 when it is not in the list.
inline int index_of(at::ScalarType t, std::initializer_list<at::ScalarType> dtypes) {
  int i = 0;
  for (auto d : dtypes) {
    if (d == t) return i;
    ++i;
  }
  return -1;
}
inline int index_of(const char* name, std::initializer_list<at::ScalarType> dtypes) {
  int i = 0;
  for (auto d : dtypes) {
    if (std::strcmp(c10::toString(d), name) == 0) return i;
    ++i;
  }
  return -1;
}

// Sizes that a graph traced with symbolic shapes leaves unknown: no tuned problem is chosen by
// them (the ops below the Autograd kernel run the nearest variant).
inline bool symbolic(const at::Tensor& t) { return t.unsafeGetTensorImpl()->has_symbolic_sizes_strides(); }

// The product of a tensor's sizes but the last (its rows, for an op over the last dimension).
inline int64_t leading(const at::Tensor& t) {
  int64_t n = 1;
  for (int64_t i = 0; i + 1 < t.dim(); ++i) n *= t.size(i);
  return n;
}

// a / b of two sizes, rounded down, 0 for b = 0 (a declaration's `ratio`, as Python's a // max(b, 1)).
inline int64_t ratio(int64_t a, int64_t b) { return a / std::max<int64_t>(b, 1); }

// A gradient of an output's shape (expanded where autograd gives one that broadcasts to it).
inline at::Tensor shaped(const at::Tensor& t, c10::IntArrayRef shape) {
  return t.sizes() == shape ? t : t.expand(shape);
}

// Contiguous and aligned for a variant's vector loads (a copy only when needed).
inline at::Tensor ready(const at::Tensor& t, int64_t alignment) {
  at::Tensor c = t.contiguous();
  if (alignment > 1 && reinterpret_cast<uintptr_t>(c.data_ptr()) % alignment) c = c.clone();
  return c;
}

// ------------------------------------------------------------------ error workspace

// One per (device, stream): `words` 32-bit device words that start zeroed (a family's kernels
// may use them as scratch, leaving them zeroed) holding the sticky error word, and `flags`,
// host memory the GPU writes (one byte per error bit), so that an async check is a plain load.
// The memory comes from cudaMalloc / cudaHostAlloc, not torch's allocator: a workspace first
// used while a CUDA graph is captured (torch.compile's cudagraph trees) must not live in the
// graph's pool, and it outlives every graph that captured it (outgrown words stay allocated).
struct Workspace {
  unsigned* words = nullptr;
  int64_t capacity = 0;
  unsigned char* flags = nullptr;         // host pointer
  unsigned char* flags_device = nullptr;  // the same memory as the kernel sees it
  cudaStream_t stream = nullptr;
  int device = 0;
};

class Workspaces {
 public:
  Workspaces(int error_word, int error_bits) : error_word_(error_word), error_bits_(error_bits) {}

  Workspace& get(int device, cudaStream_t stream, int64_t words) {
    std::lock_guard<std::mutex> lock(mutex_);
    Workspace& ws = map_[std::make_pair(device, stream)];
    if (ws.capacity >= words && ws.words != nullptr) return ws;
    const int64_t capacity = std::max<int64_t>(words, 64);
    RelaxedCapture relaxed;
    void* fresh = nullptr;
    C10_CUDA_CHECK(cudaMalloc(&fresh, capacity * sizeof(unsigned)));
    // Zeroed on a private stream of the device, so that nothing lands in a graph being captured.
    cudaStream_t& zeroing = zeroing_[device];
    if (zeroing == nullptr) C10_CUDA_CHECK(cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking));
    C10_CUDA_CHECK(cudaMemsetAsync(fresh, 0, capacity * sizeof(unsigned), zeroing));
    C10_CUDA_CHECK(cudaStreamSynchronize(zeroing));
    if (ws.flags == nullptr) {
      void* host = nullptr;
      C10_CUDA_CHECK(cudaHostAlloc(&host, 8, cudaHostAllocMapped | cudaHostAllocPortable));
      std::memset(host, 0, 8);
      void* dev = nullptr;
      C10_CUDA_CHECK(cudaHostGetDevicePointer(&dev, host, 0));
      ws.flags = static_cast<unsigned char*>(host);
      ws.flags_device = static_cast<unsigned char*>(dev);
      ws.stream = stream;
      ws.device = device;
    }
    ws.words = static_cast<unsigned*>(fresh);
    ws.capacity = capacity;
    return ws;
  }

  // Error bits whose flags have landed, cleared (never waits). Clearing the device's sticky
  // word too lets a later launch report the same bit again.
  int64_t take_landed(Workspace& ws) {
    int64_t bits = 0;
    for (int i = 0; i < error_bits_; ++i) {
      if (__atomic_load_n(ws.flags + i, __ATOMIC_ACQUIRE)) {
        bits |= int64_t(1) << i;
        __atomic_store_n(ws.flags + i, 0, __ATOMIC_RELEASE);
      }
    }
    if (bits) C10_CUDA_CHECK(cudaMemsetAsync(ws.words + error_word_, 0, sizeof(unsigned), ws.stream));
    return bits;
  }

  // Waits for every device with a workspace, then reads and clears all error flags; their OR.
  int64_t take_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t bits = 0;
    int synced = -1;
    for (auto& entry : map_) {
      Workspace& ws = entry.second;
      if (ws.flags == nullptr) continue;
      if (ws.device != synced) {
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(ws.device));
        C10_CUDA_CHECK(cudaDeviceSynchronize());
        synced = ws.device;
      }
      bits |= take_landed(ws);
    }
    return bits;
  }

 private:
  int error_word_, error_bits_;
  std::mutex mutex_;
  std::map<std::pair<int, cudaStream_t>, Workspace> map_;
  std::map<int, cudaStream_t> zeroing_;
};

// ------------------------------------------------------------------ the op's state

// A call's sizes (and the key a winner is picked by): a few numbers, kept off the heap.
using Sizes = c10::SmallVector<int64_t, 8>;

// The calls a winner's variant serves (a bit each): calls that want no gradient (inference, a
// forward alone) and calls that do (training, a forward and its backward). The export's check
// times both, and torch's op serves the kind where it won.
enum Serves : int64_t { SERVES_INFERENCE = 1, SERVES_TRAINING = 2, SERVES_BOTH = 3 };

// A winner bound at load: the variant's table, the problem it was tuned for (sizes compared
// in log distance, and a kind, e.g. a mode, that a call prefers to match), and, when it was
// tuned for another dtype pair, which (the call warns once). No table: the baseline (the torch
// op the family replaces) serves the problem, because no variant beat it there; `serves`: the
// calls the variant serves there, the baseline the others.
template <class Vtable>
struct Winner {
  std::vector<int64_t> shape;
  int64_t kind;
  const Vtable* vt;
  std::string tuned_for;
  std::vector<double> logs = {};  // log(max(size, 1)) of `shape`, made once at stage (a call takes its own once)
  int64_t serves = SERVES_BOTH;
  bool baseline() const { return vt == nullptr; }
  bool baseline_for(bool grad) const { return vt == nullptr || !(serves & (grad ? SERVES_TRAINING : SERVES_INFERENCE)); }
};

template <class Vtable>
struct Pair {
  std::vector<Winner<Vtable>> winners;
  // How far (log distance) a tuned problem of this pair serves: -1 the table's reach; 0 every
  // shape (a pair whose torch op is unfused, where a variant wins far from its tuned problem too).
  double reach = -1;
  std::shared_ptr<std::atomic<bool>> warned = std::make_shared<std::atomic<bool>>(false);
};

template <class Vtable>
struct Table {
  std::vector<Pair<Vtable>> pairs;
  bool reference = false;  // CUDA calls served by the CPU reference (an export for another arch)
  // With a baseline: a call farther than this (log distance) from every tuned problem of its
  // pair is served by the baseline, as is a pair with no tuned problem; 0: no limit.
  double reach = 0;
};

// One family's op: `name` for messages, `pairs` dtype pairs (a variant's table says which it
// is for, through `pair_of`), `describe` turns error bits into words; error bits live in
// workspace word `error_word`. `baseline`: the family's op can serve a call with the torch op
// it replaces (its C++ calls it where `choose` returns a baseline winner).
template <class Vtable>
class Op {
 public:
  using PairOf = int (*)(const Vtable*);
  using Describe = std::string (*)(int64_t);

  // `reach_sizes`: how many of the key's sizes count in the reach (the rest, a declaration's `loose`
  // ones, weigh only in the choice among tuned and measured shapes); -1 every one.
  Op(const char* name, int abi, int pairs, PairOf pair_of, Describe describe, int error_word = 0, int error_bits = 8,
     bool baseline = false, int reach_sizes = -1)
      : name(name), workspaces(error_word, error_bits), abi_(abi), pairs_(pairs), pair_of_(pair_of),
        describe_(describe), has_baseline_(baseline), reach_sizes_(reach_sizes), baseline_{{}, 0, nullptr, ""} {
    staging_.pairs.resize(pairs);
  }

  const std::string name;
  Workspaces workspaces;

  // A variant's C table from its address, checked: every family's table starts with
  // `int abi; const char* name;`.
  const Vtable* table(int64_t address) const {
    auto* t = reinterpret_cast<const Vtable*>(address);
    TORCH_CHECK(t != nullptr, name, ": null variant table");
    TORCH_CHECK(t->abi == abi_, name, ": variant ", t->name, " has ABI ", text(t->abi), " but this binding speaks ABI ",
                text(abi_), "; rebuild the variant");
    return t;
  }

  std::string describe(int64_t bits) const { return describe_ ? describe_(bits) : "error bits " + text(bits); }

  // ---------------------------------------------------------------- binding winners

  // A variant's table at `address`, or with address 0 the baseline for dtype pair `pair`; `serves`,
  // the calls the variant serves (Serves; the baseline the others).
  void stage(int64_t address, int64_t pair, std::vector<int64_t> shape, int64_t kind, std::string tuned_for,
             int64_t serves = SERVES_BOTH) {
    const Vtable* vt = address ? table(address) : nullptr;
    TORCH_CHECK(vt != nullptr || has_baseline_, name, ": this op has no baseline to stage");
    TORCH_CHECK(serves >= SERVES_INFERENCE && serves <= SERVES_BOTH, name, ": serves must be 1, 2 or 3");
    TORCH_CHECK(serves == SERVES_BOTH || has_baseline_, name, ": a variant of an op without a baseline serves every call");
    if (vt != nullptr) pair = pair_of_(vt);
    TORCH_CHECK(pair >= 0 && pair < pairs_, name, ": ", vt ? vt->name : "the baseline", " has unknown dtypes");
    for (int64_t s : shape) TORCH_CHECK(s > 0, name, ": a tuned shape must be positive");
    std::vector<double> logs;
    for (int64_t s : shape) logs.push_back(std::log(static_cast<double>(s)));
    std::lock_guard<std::mutex> lock(mutex_);
    staging_.pairs[pair].winners.push_back(
        Winner<Vtable>{std::move(shape), kind, vt, std::move(tuned_for), std::move(logs), serves});
  }

  // The staged pair's own reach (see Pair::reach).
  void set_reach(int64_t pair, double reach) {
    TORCH_CHECK(pair >= 0 && pair < pairs_, name, ": no dtype pair ", text(pair));
    TORCH_CHECK(reach >= 0, name, ": a reach must be 0 (no limit) or more");
    std::lock_guard<std::mutex> lock(mutex_);
    staging_.pairs[pair].reach = reach;
  }

  // Makes the staged winners the live table. Every table published stays (a few KB a tuner.load of
  // dozens of winners), so that a call in flight keeps the one it took and a call reads the live
  // one as a plain pointer: no lock and no count on the call path. They are never freed, at the
  // process's exit either: a daemon thread still inside a call then reads its table as it was.
  void publish(bool reference, double reach) {
    std::lock_guard<std::mutex> lock(mutex_);
    staging_.reference = reference;
    staging_.reach = reach;
    published_->reserve(published_->size() + 1);  // no throw past this line: staging_ is moved out
    published_->push_back(std::make_unique<const Table<Vtable>>(std::move(staging_)));
    live_.store(published_->back().get(), std::memory_order_release);
    staging_ = Table<Vtable>();
    staging_.pairs.resize(pairs_);
  }

  const Table<Vtable>* bound() const {
    const Table<Vtable>* t = bound_or_null();
    TORCH_CHECK(t != nullptr, name, ": no export is loaded; call tuner.load(...) first");
    return t;
  }

  const Table<Vtable>* bound_or_null() const { return live_.load(std::memory_order_acquire); }

  void set_check(int64_t mode) {
    TORCH_CHECK(mode >= CHECK_DEFERRED && mode <= CHECK_ASYNC, name, ": check mode must be 0, 1 or 2");
    check_.store(mode);
  }
  int64_t check() const { return check_.load(std::memory_order_relaxed); }

  // Nearest tuned problem: log distance over the shape, 10 more for another kind; the first
  // of equals wins. -1 when the pair has no winner (of a variant, with `variants_only`; within
  // `reach`, where it is given, over the sizes the reach counts: the key's but its loose ones). A
  // table with the export's measured regions holds dozens of winners: their logs are made at stage,
  // so that a call takes only its own (a log a size, not one a size and winner).
  int64_t nearest(const Table<Vtable>& t, int pair, c10::IntArrayRef shape, int64_t kind,
                  double* distance = nullptr, bool variants_only = false, double reach = -1) const {
    if (pair < 0 || pair >= pairs_) return -1;
    const auto& winners = t.pairs[pair].winners;
    c10::SmallVector<double, 8> logs;
    for (int64_t s : shape) logs.push_back(std::log(static_cast<double>(std::max<int64_t>(s, 1))));
    const size_t counted = reach_sizes_ < 0 ? logs.size() : static_cast<size_t>(reach_sizes_);
    int64_t best = -1;
    double best_d = 0;
    for (size_t i = 0; i < winners.size(); ++i) {
      const auto& w = winners[i];
      if (variants_only && w.baseline()) continue;
      double d = w.kind == kind ? 0.0 : 10.0, reach_d = d;
      for (size_t k = 0; k < logs.size() && k < w.logs.size(); ++k) {
        const double step = std::fabs(logs[k] - w.logs[k]);
        d += step;
        if (k < counted) reach_d += step;
      }
      if (reach >= 0 && reach_d > reach + 1e-9) continue;  // beyond its reach: never this call's
      if (best < 0 || d < best_d - 1e-12) best = static_cast<int64_t>(i), best_d = d;
    }
    if (distance != nullptr) *distance = best_d;
    return best;
  }

  bool has_baseline() const { return has_baseline_; }

  // The winner a call runs; `what()` names the call's dtypes ("x torch.float16 and weight ..."),
  // made only for a message. With a baseline, that where no variant was tuned near the call
  // (another pair, beyond the table's reach, another kind) or where none beat it.
  template <class What>
  const Winner<Vtable>& choose(const Table<Vtable>& t, int pair, c10::IntArrayRef shape, int64_t kind,
                               What&& what) const {
    const double own = pair >= 0 && pair < pairs_ ? t.pairs[pair].reach : -1;
    const double reach = own < 0 ? t.reach : own;  // 0: no limit
    const int64_t i = nearest(t, pair, shape, kind, nullptr, false, has_baseline_ && reach > 0 ? reach : -1);
    if (has_baseline_ && i < 0) return baseline_;
    return checked(t, pair, i, what);
  }

  // Whether the baseline serves a call of this pair, shape and kind in the live table (false when
  // nothing is bound or the CPU reference serves CUDA calls), one that wants a gradient (`grad`) or
  // not: what an Autograd or plain CUDA kernel asks before it calls the torch op its family replaces.
  template <class What>
  bool serves_baseline(int pair, c10::IntArrayRef shape, int64_t kind, bool grad, What&& what) const {
    const auto t = bound_or_null();
    return t != nullptr && !t->reference && choose(*t, pair, shape, kind, what).baseline_for(grad);
  }

  // The nearest variant whatever the baseline would serve (an op below the autograd kernel that
  // must run a variant, e.g. a graph traced with symbolic shapes); nullptr when the pair has none.
  const Vtable* variant(const Table<Vtable>& t, int pair, c10::IntArrayRef shape, int64_t kind) const {
    const int64_t i = nearest(t, pair, shape, kind, nullptr, true);
    return i < 0 ? nullptr : t.pairs[pair].winners[i].vt;
  }

 private:
  template <class What>
  const Winner<Vtable>& checked(const Table<Vtable>& t, int pair, int64_t i, What&& what) const {
    TORCH_CHECK(i >= 0, name, ": the loaded export has no variant for ", what());
    const auto& p = t.pairs[pair];
    const auto& best = p.winners[i];
    if (!best.tuned_for.empty() && !p.warned->exchange(true)) {
      warn(name + ": no variant was tuned for " + what() + "; using the parameters tuned for " + best.tuned_for);
    }
    return best;
  }

 public:
  // ---------------------------------------------------------------- launching

  // Runs `launch` (returns a cudaError_t as int) on `stream` with the validate mode's checks:
  // an async check raises what an earlier call flagged, a sync check waits and raises what this
  // one did. Under graph capture nothing may sync or be enqueued besides the launch: reports then
  // wait for a later eager call on this stream or for take_errors().
  template <class Launch>
  void launch(const Vtable* vt, bool validates, int64_t check, Workspace& ws, cudaStream_t stream, Launch&& launch,
              const char* what = "") {
    const bool checks = validates && check != CHECK_DEFERRED && !capturing(stream);
    if (checks && check == CHECK_ASYNC) {
      const int64_t earlier = workspaces.take_landed(ws);
      if (earlier) raise_input_error(name + ": invalid input in an earlier call: " + describe(earlier));
    }
    const int rc = launch();
    TORCH_CHECK(rc == 0, name, ": variant ", vt->name, what, " failed to launch: ",
                cudaGetErrorString(static_cast<cudaError_t>(rc)));
    if (checks && check == CHECK_SYNC) {
      C10_CUDA_CHECK(cudaStreamSynchronize(stream));
      const int64_t bits = workspaces.take_landed(ws);
      if (bits) raise_input_error(name + ": invalid input: " + describe(bits));
    }
  }

  // The guard in front of the baseline (a declaration's `guards`, templates/common/tuner_guard.cu):
  // `in`'s entries to be checked against [0, bound) (and `allowed`) and copied into `out` (both contiguous, alike)
  // by the one launch of `guard`; an input with entries and nothing in range is refused at once.
  void guard_part(TunerGuardParts& parts, const at::Tensor& in, const at::Tensor& out, int64_t bound, bool ascending,
                  std::optional<int64_t> allowed, unsigned bit) {
    const int64_t n = in.numel();
    if (n == 0) return;
    // the guard reads and writes 8- or 4-byte entries: another dtype (a uint8 target torch takes) is refused
    TORCH_CHECK(in.scalar_type() == at::kLong || in.scalar_type() == at::kInt, name, ": a guarded input must be ",
                "int64 or int32, got ", in.scalar_type());
    if (bound <= 0) raise_input_error(name + ": invalid input: " + describe(int64_t(1) << bit));
    TORCH_CHECK(parts.count < TUNER_GUARD_PARTS, name, ": at most ", TUNER_GUARD_PARTS, " guarded inputs");
    parts.part[parts.count++] = {in.data_ptr(), out.data_ptr(), n, bound, allowed.value_or(0),
                                 static_cast<int>(in.element_size()), ascending ? 1 : 0, allowed.has_value() ? 1 : 0, bit};
  }

  // The guard's launch, with the validate mode's checks as a variant's launch has them (sync:
  // raised before torch's op runs).
  void guard(const TunerGuardParts& parts, int device) {
    if (parts.count == 0) return;
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    Workspace& ws = workspaces.get(device, stream, 3);  // the error word, and two for the guard's last block
    const int64_t mode = check();
    const bool checks = mode != CHECK_DEFERRED && !capturing(stream);
    if (checks && mode == CHECK_ASYNC) {
      const int64_t earlier = workspaces.take_landed(ws);
      if (earlier) raise_input_error(name + ": invalid input in an earlier call: " + describe(earlier));
    }
    const int rc = tuner_guard(parts, ws.words, ws.flags_device, ws.words + 1, stream);
    TORCH_CHECK(rc == 0, name, ": the guard before torch's op failed to launch: ",
                cudaGetErrorString(static_cast<cudaError_t>(rc)));
    if (checks && mode == CHECK_SYNC) {
      C10_CUDA_CHECK(cudaStreamSynchronize(stream));
      const int64_t bits = workspaces.take_landed(ws);
      if (bits) raise_input_error(name + ": invalid input: " + describe(bits));
    }
  }

  // The same for a call with nothing to validate.
  template <class Launch>
  void launch(const Vtable* vt, Launch&& launch, const char* what = "") const {
    const int rc = launch();
    TORCH_CHECK(rc == 0, name, ": variant ", vt->name, what, " failed to launch: ",
                cudaGetErrorString(static_cast<cudaError_t>(rc)));
  }

  int64_t take_errors() { return workspaces.take_all(); }

 private:
  int abi_, pairs_;
  PairOf pair_of_;
  Describe describe_;
  bool has_baseline_;
  int reach_sizes_;
  Winner<Vtable> baseline_;  // what choose() returns for a call the baseline serves
  std::mutex mutex_;
  Table<Vtable> staging_;
  // every table published, kept (never freed: see publish)
  std::vector<std::unique_ptr<const Table<Vtable>>>* published_ = new std::vector<std::unique_ptr<const Table<Vtable>>>();
  std::atomic<const Table<Vtable>*> live_{nullptr};  // the last of them: never half-bound
  std::atomic<int64_t> check_{CHECK_ASYNC};
};

// ------------------------------------------------------------------ calling ops

// An op of the dispatcher by name ("tuner::rms_norm_forward") with its C++ signature, looked
// up once. Kept by name, not by signature alone: ops of one signature are many, and every
// binding loaded in a process shares these template statics. A call finds it among the names
// its thread asked for last, by the address of the name's literal (each call site's own: no
// lock, no string), and by name under the lock only the first time.
template <class Sig>
const c10::TypedOperatorHandle<Sig>& handle(const char* op) {
  using Found = std::pair<const char*, const c10::TypedOperatorHandle<Sig>*>;
  thread_local std::array<Found, 4> recent{};
  for (const Found& f : recent)
    if (f.first == op) return *f.second;
  static std::mutex mutex;
  static std::map<std::string, c10::TypedOperatorHandle<Sig>> handles;  // elements stay where they are
  const c10::TypedOperatorHandle<Sig>* found;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = handles.find(op);
    if (it == handles.end())
      it = handles.emplace(op, c10::Dispatcher::singleton().findSchemaOrThrow(op, "").typed<Sig>()).first;
    found = &it->second;
  }
  std::move_backward(recent.begin(), recent.end() - 1, recent.end());
  recent[0] = Found(op, found);
  return *found;
}

// How an Autograd kernel calls the forward and backward ops below it.
template <class Sig>
struct Call;
template <class Ret, class... Args>
struct Call<Ret(Args...)> {
  static Ret call(const char* op, Args... args) { return handle<Ret(Args...)>(op).call(std::forward<Args>(args)...); }
};

// `t` in dtype `dtype`: itself where it has it (Tensor::to is a dispatcher call even then, a
// fraction of a µs on every call of a baseline that serves small shapes).
inline at::Tensor cast_to(at::Tensor t, at::ScalarType dtype) { return t.scalar_type() == dtype ? t : t.to(dtype); }

inline at::Tensor to_cpu(const at::Tensor& t) { return t.defined() ? t.to(c10::Device(c10::kCPU)) : t; }
inline std::optional<at::Tensor> to_cpu(const std::optional<at::Tensor>& t) {
  if (!t.has_value()) return std::nullopt;
  return to_cpu(*t);
}
template <class T>
T to_cpu(const T& value) {
  return value;
}
inline at::Tensor back(const at::Tensor& t, c10::Device d) { return t.defined() ? t.to(d) : t; }
template <class... T>
std::tuple<T...> back(const std::tuple<T...>& t, c10::Device d) {
  return std::apply([&](const auto&... x) { return std::tuple<T...>(back(x, d)...); }, t);
}

// A CUDA call served by the op's CPU implementation (the float64 reference): arguments moved
// to the CPU, results back to `device`. What an export for another GPU architecture runs
// with tuner.load(fallback="reference").
template <class Sig>
struct OnCpu;
template <class Ret, class... Args>
struct OnCpu<Ret(Args...)> {
  static Ret call(const char* op, c10::Device device, Args... args) {
    return back(handle<Ret(Args...)>(op).call(to_cpu(args)...), device);
  }
};

}  // namespace tuner_op

// The binding's control ops in namespace `ns` for the tuner_op::Op object `op` (what
// tuner.runtime calls): stage a winner (its table's address, or 0 and the dtype pair for the
// baseline; tuned shape, kind, the dtype pair it was tuned for when not its own, the calls it
// serves), set a pair's own reach, publish the staged ones (with the reach of a tuned problem), the validate mode, errors.
#define TUNER_OP_CONTROL(ns, op)                                                                             \
  TORCH_LIBRARY_FRAGMENT(ns, m) {                                                                           \
    m.def("stage(int variant, int pair, int[] shape, int kind, str tuned_for, int serves=3) -> ()",         \
          [](int64_t v, int64_t p, c10::IntArrayRef s, int64_t k, std::string t, int64_t serves) {           \
            op.stage(v, p, s.vec(), k, std::move(t), serves);                                                \
          });                                                                                                \
    m.def("set_reach(int pair, float reach) -> ()", [](int64_t p, double reach) { op.set_reach(p, reach); }); \
    m.def("publish(bool reference, float reach) -> ()", [](bool r, double reach) { op.publish(r, reach); }); \
    m.def("has_baseline() -> bool", []() { return op.has_baseline(); });                                     \
    m.def("set_check(int mode) -> ()", [](int64_t mode) { op.set_check(mode); });                            \
    m.def("take_errors() -> int", []() { return op.take_errors(); });                                        \
    m.def("describe_errors(int bits) -> str", [](int64_t bits) { return op.describe(bits); });               \
    m.def("set_error_module(str module) -> ()", &tuner_binding::set_error_module);                           \
  }
