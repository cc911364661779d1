// The transports and modes epcomm-bench measures. Every transport runs every mode it supports.
//   A transport: include its header, add its type to `transports` and name it with a
//   transport_name specialisation (peer_copy.hpp has raw links for peer-mapped and RMA
//   transports). The network transports are compiled in when CMake finds their libraries.
//   A mode: a bench_case for it (like normal_case.hpp) and an entry type in `modes`.
#pragma once

#include <array>
#include <type_traits>

#include "epcomm/shm/transport.hpp"
#ifdef EPCOMM_BENCH_WITH_LIBFABRIC
#include "epcomm/libfabric/transport.hpp"
#endif
#ifdef EPCOMM_BENCH_WITH_UCX
#include "epcomm/ucx/transport.hpp"
#endif
#include "ll_case.hpp"
#include "normal_case.hpp"

namespace epcomm::bench {

template <class... T>
struct type_list {};

// Calls f(std::type_identity<T>{}) for each T of the list, in order.
template <class... T, class F>
void for_each_type(type_list<T...>, F&& f) {
  (f(std::type_identity<T>{}), ...);
}

// The name --transport selects a transport by (none: the driver does not
// compile for it).
template <class Transport>
inline constexpr const char* transport_name = nullptr;
template <>
inline constexpr const char* transport_name<shm::transport> = "shm";
#ifdef EPCOMM_BENCH_WITH_LIBFABRIC
template <>  // its provider: FI_PROVIDER
inline constexpr const char* transport_name<libfabric::transport> = "libfabric";
#endif
#ifdef EPCOMM_BENCH_WITH_UCX
template <>  // its transports: UCX_TLS
inline constexpr const char* transport_name<ucx::transport> = "ucx";
#endif

// Every transport of this build, in the order the benchmark runs them.
// clang-format off
using transports = type_list<shm::transport
#ifdef EPCOMM_BENCH_WITH_LIBFABRIC
                             , libfabric::transport
#endif
#ifdef EPCOMM_BENCH_WITH_UCX
                             , ucx::transport
#endif
                             >;
// clang-format on

struct normal_mode {
  static constexpr const char* name = "normal";
  static constexpr int default_tokens = 4096;  // DeepEP's normal-mode reference
  static constexpr std::array sweep_tokens{128, 256, 512, 1024, 2048, 4096, 8192, 16384};
  template <class Transport, class Token>
  static constexpr bool supports = requires {
    typename buffer<Transport, Token>;
  };
  template <class Transport, class Token>
  using case_type = normal_case<Transport, Token>;
};

struct low_latency_mode {
  static constexpr const char* name = "low-latency";
  static constexpr int default_tokens = 128;  // DeepEP's low-latency reference
  static constexpr std::array sweep_tokens{16, 32, 64, 128, 256};
  // The engine's wire types (bf16, fp8; tokens always enter in bf16) over the transports it
  // accepts.
  template <class Transport, class Token>
  static constexpr bool supports = requires {
    typename low_latency_buffer<Transport, Token>;
  };
  template <class Transport, class Token>
  using case_type = low_latency_case<Transport, Token>;
};

using modes = type_list<normal_mode, low_latency_mode>;

}  // namespace epcomm::bench
