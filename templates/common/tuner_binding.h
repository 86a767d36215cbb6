// What every family's torch binding needs besides its own op: error messages, bad input
// raised as tuner.errors.KernelInputError from C++, Python warnings, and CUDA graph capture
// checks. Header-only; tuner/binding.py puts this folder on each binding's include path.
#pragma once
// What the bindings use of torch, not <torch/extension.h> (the whole C++ frontend: a binding
// took 67 s of one core to compile with it, 50 s with these).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>
#include <c10/cuda/CUDAException.h>
#include <torch/csrc/Exceptions.h>
#include <cuda_runtime_api.h>

#include <string>

namespace tuner_binding {

// A shape or a number as text for error messages. Integers never go through c10::str's
// stream from a binding: built with another compiler than torch, that instantiates
// libstdc++'s integer formatting here, and it crashed on torch's streams.
inline std::string text(c10::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}
inline std::string text(int64_t value) { return std::to_string(value); }

// The Python module whose KernelInputError the bindings raise: the runtime that bound the
// op sets it (tuner.runtime, or the copy inside an exported wheel, which imports no tuner).
inline std::string& error_module() {
  static std::string name = "tuner.runtime";
  return name;
}
inline void set_error_module(std::string name) { error_module() = std::move(name); }

// Bad input that a kernel found surfaces as KernelInputError (a ValueError) of that module,
// as a Python exception set here and carried through the dispatcher by python_error; a
// c10::ValueError where Python does not run.
[[noreturn]] inline void raise_input_error(const std::string& message) {
  if (Py_IsInitialized()) {
    pybind11::gil_scoped_acquire gil;
    PyObject* module = PyImport_ImportModule(error_module().c_str());
    PyObject* type = module != nullptr ? PyObject_GetAttrString(module, "KernelInputError") : nullptr;
    Py_XDECREF(module);
    if (type != nullptr) {
      PyErr_SetString(type, message.c_str());
      Py_DECREF(type);
      python_error error;
      error.persist();
      throw error;
    }
    PyErr_Clear();
  }
  TORCH_CHECK_VALUE(false, message);
}

// A Python UserWarning where Python runs (TORCH_WARN reaches Python only through some call
// paths, and not through torch.ops), else TORCH_WARN.
inline void warn(const std::string& message) {
  if (!Py_IsInitialized()) {
    TORCH_WARN(message);
    return;
  }
  pybind11::gil_scoped_acquire gil;
  if (PyErr_WarnEx(PyExc_UserWarning, message.c_str(), 1) != 0) {  // a filter made it an error
    python_error error;
    error.persist();
    throw error;
  }
}

// Allocating is not allowed while a stream captures in the default (global) mode; calls that
// touch no stream relax the mode for this thread while this lives.
struct RelaxedCapture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  RelaxedCapture() { C10_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode)); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode); }
};

inline bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace tuner_binding
