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

template <class... Lists>
struct concat;
template <class... T>
struct concat<type_list<T...>> {
  using type = type_list<T...>;
};
template <class... A, class... B, class... Rest>
struct concat<type_list<A...>, type_list<B...>, Rest...> : concat<type_list<A..., B...>, Rest...> {
};

// Calls f(std::type_identity<T>{}) for each T of the list, in order.
template <class... T, class F>
void for_each_type(type_list<T...>, F&& f) {
  (f(std::type_identity<T>{}), ...);
}

template <class Transport>
struct transport_name;

template <>
struct transport_name<shm::transport> {
  static constexpr const char* value = "shm";
};

#ifdef EPCOMM_BENCH_WITH_LIBFABRIC
template <>
struct transport_name<libfabric::transport> {
  static constexpr const char* value = "libfabric";  // provider: FI_PROVIDER
};
using libfabric_transports = type_list<libfabric::transport>;
#else
using libfabric_transports = type_list<>;
#endif

#ifdef EPCOMM_BENCH_WITH_UCX
template <>
struct transport_name<ucx::transport> {
  static constexpr const char* value = "ucx";  // transports: UCX_TLS
};
using ucx_transports = type_list<ucx::transport>;
#else
using ucx_transports = type_list<>;
#endif

using transports = concat<type_list<shm::transport>, libfabric_transports, ucx_transports>::type;

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
