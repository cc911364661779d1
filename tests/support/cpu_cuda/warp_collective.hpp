// What each warp collective computes once every lane its mask names has
// called it: the CUDA semantics of the shuffles, votes, __match_any_sync,
// __reduce_add_sync and __syncwarp over the 32 lanes' operands.
#pragma once

#include <array>
#include <cstdint>
#include <sstream>
#include <string>

#include "epcomm/core/enum_names.hpp"

namespace epcomm::test::cpu_cuda {

inline constexpr int warp_size = 32;

enum class collective {
  shfl,
  shfl_up,
  shfl_down,
  shfl_xor,
  ballot,
  any,
  all,
  match_any,
  reduce_add,
  syncwarp
};

inline const char* name(collective c) {
  static constexpr auto names = names_for<collective, collective::syncwarp>(
      "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync", "__ballot_sync",
      "__any_sync", "__all_sync", "__match_any_sync", "__reduce_add_sync", "__syncwarp");
  return names(c);
}

// One lane's call: its operand as raw bytes (shuffles move any type of up to
// 8 bytes), and the per-lane srcLane / delta / laneMask and width.
struct lane_call {
  collective kind = collective::syncwarp;
  unsigned mask = 0;
  std::uint64_t value = 0;
  unsigned value_bytes = 0;
  int lane_arg = 0;
  int width = warp_size;

  // CUDA requires every lane the mask names to call the same intrinsic with
  // the same mask; an operand of another width is another overload.
  bool same_collective(const lane_call& other) const {
    return kind == other.kind && mask == other.mask && value_bytes == other.value_bytes;
  }
};

inline std::string describe(const lane_call& call) {
  std::ostringstream out;
  out << name(call.kind) << "(mask 0x" << std::hex << call.mask << ")";
  return out.str();
}

// The lane a shuffle reads for `lane`, or `lane` itself where CUDA returns the
// caller's own value (a source past its width-wide segment).
inline int shuffle_source(const lane_call& call, int lane) {
  const int base = lane / call.width * call.width;
  switch (call.kind) {
    case collective::shfl:
      return base + (call.lane_arg & (call.width - 1));
    case collective::shfl_up:
      return lane - call.lane_arg < base ? lane : lane - call.lane_arg;
    case collective::shfl_down:
      return lane + call.lane_arg >= base + call.width ? lane : lane + call.lane_arg;
    // CUDA: an xor lane may reach into earlier segments but not later ones.
    case collective::shfl_xor: {
      const int source = lane ^ call.lane_arg;
      return source >= base + call.width ? lane : source;
    }
    default:
      return lane;
  }
}

// Fills results[lane] for every lane in `group` (all of which made the same
// call, calls[lane]); returns what is wrong with the call, or "".
inline std::string resolve(const std::array<lane_call, warp_size>& calls, unsigned group,
                           std::array<std::uint64_t, warp_size>& results) {
  const auto in_group = [&](int lane) {
    return lane >= 0 && lane < warp_size && (group >> lane & 1u);
  };
  const auto truth = [&](int lane) { return calls[lane].value != 0; };
  unsigned votes = 0;
  std::uint64_t sum = 0;
  for (int lane = 0; lane < warp_size; ++lane) {
    if (!in_group(lane)) continue;
    votes |= truth(lane) ? 1u << lane : 0u;
    sum += calls[lane].value;
  }
  for (int lane = 0; lane < warp_size; ++lane) {
    if (!in_group(lane)) continue;
    const lane_call& call = calls[lane];
    switch (call.kind) {
      case collective::shfl:
      case collective::shfl_up:
      case collective::shfl_down:
      case collective::shfl_xor: {
        const int source = shuffle_source(call, lane);
        if (!in_group(source)) {
          return "lane " + std::to_string(lane) + " reads lane " + std::to_string(source) + " in " +
                 describe(call) + ", which does not take part (CUDA: undefined value)";
        }
        results[lane] = calls[source].value;
        break;
      }
      case collective::ballot:
        results[lane] = votes;
        break;
      case collective::any:
        results[lane] = votes != 0;
        break;
      case collective::all:
        results[lane] = votes == group;
        break;
      case collective::match_any: {
        unsigned same = 0;
        for (int other = 0; other < warp_size; ++other) {
          if (in_group(other) && calls[other].value == call.value) same |= 1u << other;
        }
        results[lane] = same;
        break;
      }
      case collective::reduce_add:
        results[lane] = static_cast<std::uint32_t>(sum);
        break;
      case collective::syncwarp:
        results[lane] = 0;
        break;
    }
  }
  return "";
}

}  // namespace epcomm::test::cpu_cuda
