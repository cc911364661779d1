// Tensors cross the binding as DLPack capsules, so the extension needs no
// libtorch: it reads a producer's DLManagedTensor in place (the capsule keeps
// ownership) and hands out views of the buffer's memory that keep the buffer
// alive until the consumer drops them.
#pragma once

#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "epcomm/core/error.hpp"
#include "epcomm/core/token_types.hpp"

namespace epcomm::python {

namespace py = pybind11;

// The DLPack type code of each element type the binding moves. fp8 crosses
// as uint8 (torch 1.13 has no float8 dtype).
template <class T>
constexpr DLDataType dl_type_of() {
  if constexpr (std::is_same_v<T, bf16>) return {kDLBfloat, 16, 1};
  if constexpr (std::is_same_v<T, fp8_e4m3>) return {kDLUInt, 8, 1};
  if constexpr (std::is_same_v<T, float>) return {kDLFloat, 32, 1};
  if constexpr (std::is_same_v<T, std::int64_t>) return {kDLInt, 64, 1};
  if constexpr (std::is_same_v<T, std::int32_t>) return {kDLInt, 32, 1};
}

inline std::string dl_type_name(DLDataType t) {
  switch (t.code) {
    case kDLInt:
      return "int" + std::to_string(t.bits);
    case kDLUInt:
      return "uint" + std::to_string(t.bits);
    case kDLFloat:
      return "float" + std::to_string(t.bits);
    case kDLBfloat:
      return "bfloat" + std::to_string(t.bits);
    default:
      return "DLPack type code " + std::to_string(t.code);
  }
}

// Where a failure to read an argument is reported: the buffer's rank and the call.
struct call_site {
  int rank;
  const char* op;
};

// A contiguous CPU tensor of element type T read from a DLPack capsule, as a
// span with its shape. None gives an empty span (an argument not given).
template <class T>
struct tensor_arg {
  std::span<T> data;
  std::vector<std::int64_t> shape;
  bool given = false;
};

template <class T>
tensor_arg<T> read_tensor(const py::object& capsule, const char* name, call_site at) {
  tensor_arg<T> out;
  if (capsule.is_none()) return out;
  auto fail = [&](const std::string& why) {
    return error(at.rank, at.op, no_peer, std::string("invalid input: ") + name + " " + why);
  };
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor"))
    throw fail("is not an unconsumed DLPack capsule");
  const auto* managed =
      static_cast<const DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  const DLTensor& t = managed->dl_tensor;
  if (t.device.device_type != kDLCPU)
    throw fail("is not in host memory (device type " + std::to_string(t.device.device_type) + ")");
  const DLDataType want = dl_type_of<std::remove_const_t<T>>();
  if (t.dtype.code != want.code || t.dtype.bits != want.bits || t.dtype.lanes != 1)
    throw fail("has element type " + dl_type_name(t.dtype) + ", expected " + dl_type_name(want));
  std::int64_t count = 1;
  out.shape.assign(t.shape, t.shape + t.ndim);
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.strides != nullptr && t.shape[d] > 1 && t.strides[d] != count)
      throw fail("is not contiguous");
    count *= t.shape[d];
  }
  auto* base = static_cast<std::byte*>(t.data) + t.byte_offset;
  out.data = {reinterpret_cast<T*>(base), static_cast<std::size_t>(count)};
  out.given = true;
  return out;
}

// A view of `data` with `shape` as a DLPack capsule; `owner` (the buffer)
// stays alive until the consumer releases the view.
template <class T>
py::capsule export_view(std::span<const T> data, std::vector<std::int64_t> shape,
                        py::object owner) {
  struct context {
    std::vector<std::int64_t> shape;
    py::object owner;
  };
  auto* ctx = new context{std::move(shape), std::move(owner)};
  auto* managed = new DLManagedTensor{};
  managed->dl_tensor.data = const_cast<T*>(data.data());
  managed->dl_tensor.device = {kDLCPU, 0};
  managed->dl_tensor.ndim = static_cast<std::int32_t>(ctx->shape.size());
  managed->dl_tensor.dtype = dl_type_of<T>();
  managed->dl_tensor.shape = ctx->shape.data();
  managed->dl_tensor.strides = nullptr;  // compact row-major
  managed->manager_ctx = ctx;
  managed->deleter = [](DLManagedTensor* self) {
    py::gil_scoped_acquire gil;
    delete static_cast<context*>(self->manager_ctx);
    delete self;
  };
  // A capsule nobody consumed still owns its tensor.
  return py::capsule(managed, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      m->deleter(m);
    }
  });
}

}  // namespace epcomm::python
