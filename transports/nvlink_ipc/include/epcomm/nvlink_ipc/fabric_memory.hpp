// Device memory shared through CUDA fabric handles (cuMem* virtual memory
// management with CU_MEM_HANDLE_TYPE_FABRIC): the path for multi-node NVLink
// domains (GB200 NVL72 and the like), where cudaIpc handles do not reach
// other hosts. Needs CUDA >= 12.5 at build time (to resolve entry points by
// version), a driver and system with fabric support (IMEX channels) at run
// time; both are checked and reported, never assumed.
//
// The driver functions are resolved through the runtime
// (cudaGetDriverEntryPointByVersion), so nothing links libcuda directly.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "epcomm/core/error.hpp"

namespace epcomm::nvlink_ipc::detail {

#if CUDART_VERSION >= 12050
inline constexpr bool fabric_compiled = true;

struct driver_api {
  decltype(&::cuDeviceGet) device_get;
  decltype(&::cuDeviceGetAttribute) device_attribute;
  decltype(&::cuMemGetAllocationGranularity) granularity;
  decltype(&::cuMemCreate) create;
  decltype(&::cuMemRelease) release;
  decltype(&::cuMemExportToShareableHandle) export_handle;
  decltype(&::cuMemImportFromShareableHandle) import_handle;
  decltype(&::cuMemAddressReserve) reserve;
  decltype(&::cuMemAddressFree) address_free;
  decltype(&::cuMemMap) map;
  decltype(&::cuMemUnmap) unmap;
  decltype(&::cuMemSetAccess) set_access;
};

// Resolves every entry point once; throws if the driver lacks one.
inline const driver_api& driver(int rank) {
  static const driver_api api = [rank] {
    driver_api a{};
    auto resolve = [rank](const char* name, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult found{};
      // 12030: the first release with fabric handles; the runtime picks the
      // ABI of each symbol as of that version.
      if (cudaGetDriverEntryPointByVersion(name, &p, 12030, cudaEnableDefault, &found) !=
              cudaSuccess ||
          found != cudaDriverEntryPointSuccess || p == nullptr)
        throw error(rank, "nvlink_ipc setup", no_peer,
                    std::string("the CUDA driver does not provide ") + name +
                        " (fabric memory needs a driver for CUDA 12.3 or newer)");
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    resolve("cuDeviceGet", a.device_get);
    resolve("cuDeviceGetAttribute", a.device_attribute);
    resolve("cuMemGetAllocationGranularity", a.granularity);
    resolve("cuMemCreate", a.create);
    resolve("cuMemRelease", a.release);
    resolve("cuMemExportToShareableHandle", a.export_handle);
    resolve("cuMemImportFromShareableHandle", a.import_handle);
    resolve("cuMemAddressReserve", a.reserve);
    resolve("cuMemAddressFree", a.address_free);
    resolve("cuMemMap", a.map);
    resolve("cuMemUnmap", a.unmap);
    resolve("cuMemSetAccess", a.set_access);
    return a;
  }();
  return api;
}

inline void check_cu(CUresult r, int rank, int peer, const char* call) {
  if (r == CUDA_SUCCESS) return;
  throw error(rank, "nvlink_ipc setup", peer,
              std::string(call) + " failed with CUresult " + std::to_string(static_cast<int>(r)));
}

// One allocation mapped into this process: our own, or a peer's import.
class fabric_mapping {
 public:
  fabric_mapping() = default;
  fabric_mapping(const fabric_mapping&) = delete;
  fabric_mapping& operator=(const fabric_mapping&) = delete;
  fabric_mapping(fabric_mapping&& o) noexcept { *this = std::move(o); }
  fabric_mapping& operator=(fabric_mapping&& o) noexcept {
    std::swap(rank_, o.rank_);
    std::swap(ptr_, o.ptr_);
    std::swap(size_, o.size_);
    std::swap(handle_, o.handle_);
    std::swap(reserved_, o.reserved_);
    std::swap(mapped_, o.mapped_);
    std::swap(has_handle_, o.has_handle_);
    return *this;
  }
  ~fabric_mapping() { reset(); }

  std::byte* data() const { return reinterpret_cast<std::byte*>(ptr_); }

  // Allocates `bytes` (rounded up to the granularity) on `device`, exportable
  // as a fabric handle, mapped read-write here; `*exported` receives the handle.
  static fabric_mapping allocate(int rank, int device, std::size_t bytes,
                                 CUmemFabricHandle* exported) {
    const driver_api& d = driver(rank);
    fabric_mapping m;
    m.rank_ = rank;
    const CUmemAllocationProp prop = properties(rank, device);
    m.size_ = rounded(rank, prop, bytes);
    check_cu(d.create(&m.handle_, m.size_, &prop, 0), rank, no_peer, "cuMemCreate");
    m.has_handle_ = true;
    check_cu(d.export_handle(exported, m.handle_, CU_MEM_HANDLE_TYPE_FABRIC, 0), rank, no_peer,
             "cuMemExportToShareableHandle(FABRIC)");
    m.map_here(rank, device, no_peer);
    return m;
  }

  // Maps a peer's exported allocation of `bytes` (before rounding) here.
  static fabric_mapping import(int rank, int device, int peer, const CUmemFabricHandle& handle,
                               std::size_t bytes) {
    const driver_api& d = driver(rank);
    fabric_mapping m;
    m.rank_ = rank;
    m.size_ = rounded(rank, properties(rank, device), bytes);
    CUmemFabricHandle copy = handle;  // the import takes a non-const pointer
    check_cu(d.import_handle(&m.handle_, &copy, CU_MEM_HANDLE_TYPE_FABRIC), rank, peer,
             "cuMemImportFromShareableHandle(FABRIC)");
    m.has_handle_ = true;
    m.map_here(rank, device, peer);
    return m;
  }

  // Whether `device` can export fabric handles at all.
  static bool supported(int rank, int device) {
    const driver_api& d = driver(rank);
    CUdevice dev{};
    check_cu(d.device_get(&dev, device), rank, no_peer, "cuDeviceGet");
    int yes = 0;
    check_cu(d.device_attribute(&yes, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev), rank,
             no_peer, "cuDeviceGetAttribute(HANDLE_TYPE_FABRIC_SUPPORTED)");
    return yes != 0;
  }

 private:
  static CUmemAllocationProp properties(int rank, int device) {
    CUdevice dev{};
    check_cu(driver(rank).device_get(&dev, device), rank, no_peer, "cuDeviceGet");
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    return prop;
  }

  static std::size_t rounded(int rank, const CUmemAllocationProp& prop, std::size_t bytes) {
    std::size_t g = 0;
    check_cu(driver(rank).granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), rank,
             no_peer, "cuMemGetAllocationGranularity");
    return (bytes + g - 1) / g * g;
  }

  void map_here(int rank, int device, int peer) {
    const driver_api& d = driver(rank);
    check_cu(d.reserve(&ptr_, size_, 0, 0, 0), rank, peer, "cuMemAddressReserve");
    reserved_ = true;
    check_cu(d.map(ptr_, size_, 0, handle_, 0), rank, peer, "cuMemMap");
    mapped_ = true;
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    check_cu(d.set_access(ptr_, size_, &access, 1), rank, peer, "cuMemSetAccess");
  }

  // Teardown cannot report: it runs in destructors, after the buffer's last
  // call has completed on every rank.
  void reset() noexcept {
    if (!has_handle_ && !reserved_) return;
    const driver_api& d = driver(rank_);
    if (mapped_) d.unmap(ptr_, size_);
    if (reserved_) d.address_free(ptr_, size_);
    if (has_handle_) d.release(handle_);
    mapped_ = reserved_ = has_handle_ = false;
  }

  int rank_ = 0;
  CUdeviceptr ptr_ = 0;
  std::size_t size_ = 0;
  CUmemGenericAllocationHandle handle_{};
  bool reserved_ = false;
  bool mapped_ = false;
  bool has_handle_ = false;
};
#else
inline constexpr bool fabric_compiled = false;
#endif

}  // namespace epcomm::nvlink_ipc::detail
