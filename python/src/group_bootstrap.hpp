// The bootstrap of a Python buffer: the all-gather and barrier of a
// torch.distributed process group, reached through two Python callables
// (epcomm/_group.py), so that construction needs no port of its own. Only
// constructors call it, with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "epcomm/bootstrap/concept.hpp"
#include "epcomm/core/error.hpp"

namespace epcomm::python {

namespace py = pybind11;

class group_bootstrap {
 public:
  // all_gather(bytes, timeout_s) -> list of world_size bytes; barrier(timeout_s).
  group_bootstrap(int rank, int world_size, int local_rank, int local_world_size,
                  py::function all_gather, py::function barrier)
      : rank_(rank),
        world_(world_size),
        local_rank_(local_rank),
        local_world_(local_world_size),
        all_gather_(std::move(all_gather)),
        barrier_(std::move(barrier)) {}

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  int local_rank() const { return local_rank_; }
  int local_world_size() const { return local_world_; }

  std::vector<std::byte> all_gather(std::span<const std::byte> mine, deadline dl) {
    std::vector<std::byte> all;
    call("bootstrap all_gather", [&] {
      const py::bytes block(reinterpret_cast<const char*>(mine.data()), mine.size());
      const py::list blocks = all_gather_(block, seconds_left(dl));
      if (static_cast<int>(blocks.size()) != world_)
        throw error(rank_, "bootstrap all_gather", no_peer,
                    "the group returned " + std::to_string(blocks.size()) + " blocks for " +
                        std::to_string(world_) + " ranks");
      for (int r = 0; r < world_; ++r) {
        const std::string b = blocks[r].cast<py::bytes>();
        if (b.size() != mine.size())
          throw error(rank_, "bootstrap all_gather", r,
                      "block of " + std::to_string(b.size()) + " bytes, this rank's has " +
                          std::to_string(mine.size()));
        const auto* p = reinterpret_cast<const std::byte*>(b.data());
        all.insert(all.end(), p, p + b.size());
      }
    });
    return all;
  }

  void barrier(deadline dl) {
    call("bootstrap barrier", [&] { barrier_(seconds_left(dl)); });
  }

 private:
  static double seconds_left(const deadline& dl) {
    return std::chrono::duration<double>(dl.at() - steady::now()).count();
  }

  // A failure of the group (a lost rank, its own timeout) becomes an
  // epcomm::error of this rank, so the caller sees one kind of failure.
  template <class F>
  void call(const char* op, F&& f) {
    try {
      f();
    } catch (const py::error_already_set& e) {
      throw error(rank_, op, no_peer, std::string("the process group failed: ") + e.what());
    }
  }

  int rank_;
  int world_;
  int local_rank_;
  int local_world_;
  py::function all_gather_;
  py::function barrier_;
};

static_assert(bootstrap<group_bootstrap>);

}  // namespace epcomm::python
