// Low-latency mode for CPU tensors: epcomm::low_latency_buffer over shared
// memory, one engine serving both wires, each dispatch choosing its own
// (DeepEP's use_fp8). Every call is a send phase that returns a hook; calling
// the hook runs the receive phase (DeepEP's return_recv_hook), and the
// results are views of the buffer's parity region, valid until the next call
// on that parity.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "bindings.hpp"
#include "dlpack_tensor.hpp"
#include "epcomm/low_latency/buffer.hpp"
#include "epcomm/shm/transport.hpp"
#include "group_bootstrap.hpp"

namespace epcomm::python {
namespace {

// A receive hook of the engine, run at most once, with the GIL released
// (other Python threads go on while it waits for peers).
template <class Hook>
class run_once {
 public:
  explicit run_once(Hook hook) : hook_(std::move(hook)) {}

  auto operator()(int rank, const char* op) {
    if (done_) throw error(rank, op, no_peer, "invalid input: this receive hook has already run");
    done_ = true;
    py::gil_scoped_release free;
    return hook_();
  }

 private:
  Hook hook_;
  bool done_ = false;
};

class low_latency_binding {
 public:
  using engine = low_latency_buffer<shm::transport, bf16, fp8_e4m3>;

  low_latency_binding(group_bootstrap& boot, const low_latency_config& cfg)
      : engine_(std::make_unique<engine>(boot, cfg)) {}

  // The receive phase of one dispatch: (recv_x, recv_x_scales or None,
  // recv_count, recv_src [E_local][R*max][3], recv_range [E_local][R][2],
  // handle). Scales come as the buffer lays them out: row_major
  // [E_local][R*max][G] float, token_major [E_local][G][S] float, ue8m0
  // [E_local][W][S] int32 (low_latency/scale_layout.hpp).
  class dispatch_hook {
   public:
    template <class Wire>
    dispatch_hook(typename engine::template dispatch_hook_for<Wire> hook, py::object owner)
        : receive_([receive = run_once(std::move(hook)), owner]() mutable {
            engine& eng = *owner.cast<low_latency_binding&>().engine_;
            return results(receive(eng.rank(), "low-latency dispatch"), eng, owner);
          }) {}

    py::tuple operator()() { return receive_(); }

   private:
    template <class Wire>
    static py::tuple results(const ll_dispatch_result<Wire>& res, const engine& eng,
                             const py::object& owner) {
      const wire::ll::shape& s = eng.shape();
      const std::int64_t e = s.local_experts(), rows = s.rows_per_expert();
      py::object scales = py::none();
      if constexpr (std::is_same_v<Wire, fp8_e4m3>) {
        const std::int64_t words = wire::ll::scale_words_per_token(s);
        const auto stride = static_cast<std::int64_t>(wire::ll::scale_token_stride(s));
        switch (s.scale_layout) {
          case ll_scale_layout::row_major:
            scales = export_view(res.recv_x_scales, {e, rows, words}, owner);
            break;
          case ll_scale_layout::token_major:
            scales = export_view(res.recv_x_scales, {e, words, stride}, owner);
            break;
          case ll_scale_layout::ue8m0:
            scales = export_view(res.recv_x_scales_ue8m0, {e, words, stride}, owner);
            break;
        }
      }
      const std::span<const std::int32_t> src(
          reinterpret_cast<const std::int32_t*>(res.recv_src.data()), res.recv_src.size() * 3);
      const std::span<const std::int32_t> range(
          reinterpret_cast<const std::int32_t*>(res.recv_range.data()), res.recv_range.size() * 2);
      return py::make_tuple(
          export_view(res.recv_x, {e, rows, s.hidden}, owner), scales,
          export_view(res.recv_count, {e}, owner), export_view(src, {e, rows, 3}, owner),
          export_view(range, {e, std::int64_t{s.world_size}, 2}, owner), res.handle);
    }

    // Runs the engine's hook once; its owner keeps the buffer alive while
    // the hook is held.
    std::function<py::tuple()> receive_;
  };

  // The receive phase of one combine: a view of out[T][H] (bf16).
  class combine_hook {
   public:
    combine_hook(typename engine::combine_hook hook, py::object owner, int num_tokens)
        : receive_(std::move(hook)), owner_(std::move(owner)), num_tokens_(num_tokens) {}

    py::capsule operator()() {
      engine& eng = *owner_.cast<low_latency_binding&>().engine_;
      const std::span<const bf16> out = receive_(eng.rank(), "low-latency combine");
      return export_view(out, {num_tokens_, std::int64_t{eng.shape().hidden}}, owner_);
    }

   private:
    run_once<typename engine::combine_hook> receive_;
    py::object owner_;
    std::int64_t num_tokens_;
  };

  static dispatch_hook dispatch_send(py::object self, const py::object& x,
                                     const py::object& topk_idx, bool use_fp8) {
    engine& eng = *self.cast<low_latency_binding&>().engine_;
    const call_site at{eng.rank(), "low-latency dispatch"};
    const auto xs = read_tensor<const bf16>(x, "x", at);
    const auto idx = read_tensor<const std::int64_t>(topk_idx, "topk_idx", at);
    if (xs.shape.size() != 2 || idx.shape.size() != 2)
      throw error(at.rank, at.op, no_peer, "invalid input: x and topk_idx must be 2-D");
    const ll_dispatch_input in{static_cast<int>(xs.shape[0]), static_cast<int>(idx.shape[1]),
                               xs.data, idx.data};
    const auto send = [&]<class Wire>() {
      auto hook = [&] {
        py::gil_scoped_release free;
        return eng.template low_latency_dispatch_send<Wire>(in);
      }();
      return dispatch_hook(std::move(hook), self);
    };
    return use_fp8 ? send.template operator()<fp8_e4m3>() : send.template operator()<bf16>();
  }

  static combine_hook combine_send(py::object self, const py::object& y, const py::object& topk_idx,
                                   const py::object& topk_weights, const ll_handle& h) {
    engine& eng = *self.cast<low_latency_binding&>().engine_;
    const call_site at{eng.rank(), "low-latency combine"};
    const ll_combine_input in{read_tensor<const bf16>(y, "x", at).data,
                              read_tensor<const std::int64_t>(topk_idx, "topk_idx", at).data,
                              read_tensor<const float>(topk_weights, "topk_weights", at).data};
    auto hook = [&] {
      py::gil_scoped_release free;
      return eng.low_latency_combine_send(in, h);
    }();
    return combine_hook(std::move(hook), self, h.num_tokens);
  }

  static py::capsule combine_send_buffer(py::object self, const ll_handle& h) {
    engine& eng = *self.cast<low_latency_binding&>().engine_;
    const wire::ll::shape& s = eng.shape();
    return export_view(std::span<const bf16>(eng.combine_send_buffer(h)),
                       {s.local_experts(), s.rows_per_expert(), s.hidden}, self);
  }

  engine& get() { return *engine_; }

 private:
  std::unique_ptr<engine> engine_;
};

void bind_low_latency_buffer(py::module_& m, const char* name) {
  using B = low_latency_binding;
  py::class_<B> cls(m, name);
  py::class_<typename B::dispatch_hook>(cls, "DispatchHook")
      .def("__call__", &B::dispatch_hook::operator());
  py::class_<typename B::combine_hook>(cls, "CombineHook")
      .def("__call__", &B::combine_hook::operator());
  cls.def(py::init([](group_bootstrap& boot, int num_experts, int hidden, int max_topk,
                      int max_tokens_per_rank, bool round_scale, ll_scale_layout scale_layout,
                      std::chrono::milliseconds timeout, bool mask_lost_ranks) {
            return std::make_unique<B>(
                boot, low_latency_config{.num_experts = num_experts,
                                         .hidden = hidden,
                                         .max_topk = max_topk,
                                         .max_tokens_per_rank = max_tokens_per_rank,
                                         .round_scale = round_scale,
                                         .timeout = timeout,
                                         .mask_lost_ranks = mask_lost_ranks,
                                         .scale_layout = scale_layout});
          }),
          py::arg("bootstrap"), py::arg("num_experts"), py::arg("hidden"), py::arg("max_topk"),
          py::arg("max_tokens_per_rank"), py::arg("round_scale"), py::arg("scale_layout"),
          py::arg("timeout"), py::arg("mask_lost_ranks"))
      .def("dispatch_send", &B::dispatch_send)
      .def("combine_send", &B::combine_send)
      .def("combine_send_buffer", &B::combine_send_buffer)
      .def_property_readonly("rank", [](B& b) { return b.get().rank(); })
      .def_property_readonly("world_size", [](B& b) { return b.get().world_size(); })
      .def_property_readonly("num_experts", [](B& b) { return b.get().shape().num_experts; })
      .def_property_readonly("hidden", [](B& b) { return b.get().shape().hidden; })
      .def_property_readonly("max_topk", [](B& b) { return b.get().shape().max_topk; })
      .def_property_readonly("max_tokens_per_rank",
                             [](B& b) { return b.get().shape().max_tokens_per_rank; })
      .def("lost_ranks", [](B& b) { return b.get().lost_ranks(); })
      .def("abort", [](B& b) { b.get().abort(); })
      .def("dispatch_wait", [](B& b) { return b.get().stats().dispatch_wait; })
      .def("combine_wait", [](B& b) { return b.get().stats().combine_wait; });
}

}  // namespace

void bind_low_latency(py::module_& m) {
  py::enum_<ll_scale_layout>(m, "ScaleLayout")
      .value("row_major", ll_scale_layout::row_major)
      .value("token_major", ll_scale_layout::token_major)
      .value("ue8m0", ll_scale_layout::ue8m0);
  py::class_<ll_handle>(m, "LowLatencyHandle")
      .def_readonly("parity", &ll_handle::parity)
      .def_readonly("num_tokens", &ll_handle::num_tokens)
      .def_readonly("topk", &ll_handle::topk);
  bind_low_latency_buffer(m, "LowLatencyBuffer");
}

}  // namespace epcomm::python
