// Normal (throughput) mode for CPU tensors: epcomm::buffer over shared
// memory. NormalBuffer serves DeepEP's token types, bf16 and fp8, from one
// set of regions sized for bf16 rows; NormalBuffer_f32 serves fp32 (twice
// the bytes per row, so only a caller that dispatches fp32 pays for it).
// Each call names its type (token_traits name), and the binding picks the
// engine's instantiation for it at run time. Results are views of the
// buffer; epcomm/buffer.py copies what must outlive the next call.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "bindings.hpp"
#include "dlpack_tensor.hpp"
#include "epcomm/host/completion.hpp"
#include "epcomm/normal/buffer.hpp"
#include "epcomm/shm/transport.hpp"
#include "group_bootstrap.hpp"

namespace epcomm::python {
namespace {

// Calls f.template operator()<T>() for the first T of Served whose
// token_traits name is `kind`; any other kind is the caller's invalid input.
template <class... Served, class F>
void for_type(std::string_view kind, const call_site& at, F&& f) {
  const bool served =
      ((kind == token_traits<Served>::name && (f.template operator()<Served>(), true)) || ...);
  if (served) return;
  std::string names;
  for (std::string_view name : {token_traits<Served>::name...})
    if (names.find(name) == std::string::npos)
      names += (names.empty() ? "" : ", ") + std::string(name);
  throw error(at.rank, at.op, no_peer,
              "invalid input: this buffer serves " + names + ", not " + std::string(kind));
}

// A call running on the engine's communication thread (async_finish). It
// holds the Python objects whose memory the call reads and writes, and it is
// never let go of before the call has finished: a pending call dropped
// unwaited waits in its destructor, or the call would write into freed
// tensors.
class pending_call {
 public:
  pending_call(completion<void> done, py::tuple keep)
      : done_(std::move(done)), keep_(std::move(keep)) {}
  pending_call(const pending_call&) = delete;
  pending_call& operator=(const pending_call&) = delete;
  ~pending_call() {
    if (waited_) return;
    py::gil_scoped_release free;
    done_.wait();
  }

  bool ready() const { return waited_ || done_.ready(); }

  // Blocks until the call has finished and raises its error, once; later
  // waits return at once.
  void wait() {
    if (waited_) return;
    {
      py::gil_scoped_release free;
      done_.wait();
    }
    waited_ = true;
    done_.get();
  }

 private:
  completion<void> done_;
  py::tuple keep_;
  bool waited_ = false;
};

template <class... Tokens>
class normal_buffer {
 public:
  using engine = buffer<shm::transport, Tokens...>;

  normal_buffer(group_bootstrap& boot, const buffer_config& cfg)
      : engine_(std::make_unique<engine>(boot, cfg)) {}

  // (num_recv_tokens, recv_x, recv_x_scales or None, recv_topk_idx,
  //  recv_topk_weights, recv_src_idx, num_recv_tokens_per_expert, handle)
  py::tuple dispatch(py::object self, std::string_view kind, const py::object& x,
                     const py::object& x_scales, const py::object& topk_idx,
                     const py::object& topk_weights, int worst_case_recv_tokens,
                     int expert_alignment) {
    const call_site at{engine_->rank(), "dispatch"};
    py::tuple out;
    for_type<Tokens...>(kind, at, [&]<class Token>() {
      out = dispatch_as<Token>(self, at, x, x_scales, topk_idx, topk_weights,
                               worst_case_recv_tokens, expert_alignment);
    });
    return out;
  }

  // (num_recv_tokens, recv_x, recv_x_scales or None): new rows along the
  // routing of the dispatch that returned `h`, no counts exchanged.
  py::tuple dispatch_cached(py::object self, std::string_view kind, const py::object& x,
                            const py::object& x_scales, const dispatch_handle& h) {
    const call_site at{engine_->rank(), "dispatch"};
    py::tuple out;
    for_type<Tokens...>(kind, at, [&]<class Token>() {
      out = dispatch_cached_as<Token>(self, at, x, x_scales, h);
    });
    return out;
  }

  // combine_send_buffer in the first token's combine type.
  py::capsule combine_send_buffer(py::object self, const dispatch_handle& h) {
    return export_view(
        std::span<const typename engine::first_combine>(engine_->combine_send_buffer(h)),
        {h.num_recv_tokens, h.hidden}, self);
  }

  // Writes out_x[T][H] and, when topk_weights is given, out_weights[T][K];
  // `kind` names y's element type.
  void combine(std::string_view kind, const py::object& y, const dispatch_handle& h,
               const py::object& topk_weights, const py::object& bias_0, const py::object& bias_1,
               const py::object& out_x, const py::object& out_weights) {
    with_combine_args(
        kind, y, topk_weights, bias_0, bias_1, out_x, out_weights,
        [&]<class Out>(const combine_input<Out>& in, std::span<Out> ox, std::span<float> ow) {
          py::gil_scoped_release free;
          engine_->template combine<Out>(in, h, ox, ow);
        });
  }

  // combine on the engine's communication thread: returns at once with the
  // call pending, which keeps every argument alive until it has finished.
  std::unique_ptr<pending_call> combine_async(std::string_view kind, const py::object& y,
                                              const dispatch_handle& h,
                                              const py::object& topk_weights,
                                              const py::object& bias_0, const py::object& bias_1,
                                              const py::object& out_x,
                                              const py::object& out_weights) {
    std::unique_ptr<pending_call> pending;
    with_combine_args(
        kind, y, topk_weights, bias_0, bias_1, out_x, out_weights,
        [&]<class Out>(const combine_input<Out>& in, std::span<Out> ox, std::span<float> ow) {
          pending = std::make_unique<pending_call>(
              engine_->template combine_async<Out>(in, h, ox, ow),
              py::make_tuple(y, topk_weights, bias_0, bias_1, out_x, out_weights));
        });
    return pending;
  }

  engine& get() { return *engine_; }

 private:
  // f.template operator()<Out>(input, out_x, out_weights) with combine's
  // arguments read as `kind`, y's element type.
  template <class F>
  void with_combine_args(std::string_view kind, const py::object& y, const py::object& topk_weights,
                         const py::object& bias_0, const py::object& bias_1,
                         const py::object& out_x, const py::object& out_weights, F&& f) {
    const call_site at{engine_->rank(), "combine"};
    for_type<combine_type_t<Tokens>...>(kind, at, [&]<class Out>() {
      const auto ys = read_tensor<const Out>(y, "x", at);
      const auto weights = read_tensor<const float>(topk_weights, "topk_weights", at);
      combine_input<Out> in{ys.data, std::nullopt,
                            read_tensor<const Out>(bias_0, "bias[0]", at).data,
                            read_tensor<const Out>(bias_1, "bias[1]", at).data};
      if (weights.given) in.topk_weights = weights.data;
      f.template operator()<Out>(in, read_tensor<Out>(out_x, "out", at).data,
                                 read_tensor<float>(out_weights, "out topk_weights", at).data);
    });
  }

  template <class Token>
  py::tuple dispatch_as(py::object self, const call_site& at, const py::object& x,
                        const py::object& x_scales, const py::object& topk_idx,
                        const py::object& topk_weights, int worst_case_recv_tokens,
                        int expert_alignment) {
    const auto xs = read_tensor<const Token>(x, "x", at);
    const auto scales = read_tensor<const float>(x_scales, "x_scales", at);
    const auto idx = read_tensor<const std::int64_t>(topk_idx, "topk_idx", at);
    const auto weights = read_tensor<const float>(topk_weights, "topk_weights", at);
    if (xs.shape.size() != 2 || idx.shape.size() != 2)
      throw error(at.rank, at.op, no_peer, "invalid input: x and topk_idx must be 2-D");
    dispatch_input<Token> in{static_cast<int>(xs.shape[0]),
                             static_cast<int>(xs.shape[1]),
                             static_cast<int>(idx.shape[1]),
                             xs.data,
                             scales.data,
                             idx.data,
                             weights.data};
    dispatch_result<Token> res;
    {
      py::gil_scoped_release free;
      res = engine_->template dispatch<Token>(in, {.worst_case_recv_tokens = worst_case_recv_tokens,
                                                   .expert_alignment = expert_alignment});
    }
    const std::int64_t rows = static_cast<std::int64_t>(res.recv_src_idx.size());
    const std::int64_t k = in.topk;
    py::object recv_scales = py::none();
    if (!res.recv_x_scales.empty() || !scales.data.empty())
      recv_scales = export_view(res.recv_x_scales, {rows, in.hidden / 128}, self);
    return py::make_tuple(res.num_recv_tokens, export_view(res.recv_x, {rows, in.hidden}, self),
                          recv_scales, export_view(res.recv_topk_idx, {rows, k}, self),
                          export_view(res.recv_topk_weights, {rows, k}, self),
                          export_view(res.recv_src_idx, {rows}, self),
                          res.num_recv_tokens_per_expert, std::move(res.handle));
  }

  template <class Token>
  py::tuple dispatch_cached_as(py::object self, const call_site& at, const py::object& x,
                               const py::object& x_scales, const dispatch_handle& h) {
    const auto xs = read_tensor<const Token>(x, "x", at);
    const auto scales = read_tensor<const float>(x_scales, "x_scales", at);
    dispatch_result<Token> res;
    {
      py::gil_scoped_release free;
      res =
          engine_->template dispatch<Token>(cached_dispatch_input<Token>{xs.data, scales.data}, h);
    }
    const std::int64_t rows = res.num_recv_tokens;
    py::object recv_scales = py::none();
    if (!res.recv_x_scales.empty() || !scales.data.empty())
      recv_scales = export_view(res.recv_x_scales, {rows, h.hidden / 128}, self);
    return py::make_tuple(res.num_recv_tokens, export_view(res.recv_x, {rows, h.hidden}, self),
                          recv_scales);
  }

  std::unique_ptr<engine> engine_;
};

template <class... Tokens>
void bind_normal_buffer(py::module_& m, const char* name) {
  using B = normal_buffer<Tokens...>;
  py::class_<B>(m, name)
      .def(py::init([](group_bootstrap& boot, int num_experts, int max_hidden, int max_topk,
                       int max_tokens_per_rank, std::chrono::milliseconds timeout,
                       bool mask_lost_ranks, std::size_t max_buffer_bytes) {
             return std::make_unique<B>(boot,
                                        buffer_config{.num_experts = num_experts,
                                                      .max_hidden = max_hidden,
                                                      .max_topk = max_topk,
                                                      .max_tokens_per_rank = max_tokens_per_rank,
                                                      .timeout = timeout,
                                                      .mask_lost_ranks = mask_lost_ranks,
                                                      .max_buffer_bytes = max_buffer_bytes});
           }),
           py::arg("bootstrap"), py::arg("num_experts"), py::arg("max_hidden"), py::arg("max_topk"),
           py::arg("max_tokens_per_rank"), py::arg("timeout"), py::arg("mask_lost_ranks"),
           py::arg("max_buffer_bytes") = 0)
      .def("dispatch",
           [](py::object self, std::string_view kind, const py::object& x,
              const py::object& x_scales, const py::object& topk_idx,
              const py::object& topk_weights, int worst, int alignment) {
             return self.cast<B&>().dispatch(self, kind, x, x_scales, topk_idx, topk_weights, worst,
                                             alignment);
           })
      .def("dispatch_cached",
           [](py::object self, std::string_view kind, const py::object& x,
              const py::object& x_scales, const dispatch_handle& h) {
             return self.cast<B&>().dispatch_cached(self, kind, x, x_scales, h);
           })
      .def("combine_send_buffer",
           [](py::object self, const dispatch_handle& h) {
             return self.cast<B&>().combine_send_buffer(self, h);
           })
      .def("combine", &B::combine)
      .def("combine_async", &B::combine_async)
      .def_property_readonly("rank", [](B& b) { return b.get().rank(); })
      .def_property_readonly("world_size", [](B& b) { return b.get().world_size(); })
      .def_property_readonly("window_rows", [](B& b) { return b.get().capacity().window_rows; })
      .def("lost_ranks", [](B& b) { return b.get().lost_ranks(); })
      .def("abort", [](B& b) { b.get().abort(); })
      .def("wait_per_peer", [](B& b) { return b.get().stats().wait_per_peer; });
}

}  // namespace

void bind_normal(py::module_& m) {
  py::class_<pending_call>(m, "PendingCall")
      .def("ready", &pending_call::ready)
      .def("wait", &pending_call::wait);
  py::class_<dispatch_handle>(m, "DispatchHandle")
      .def_readonly("rank", &dispatch_handle::rank)
      .def_readonly("world_size", &dispatch_handle::world_size)
      .def_readonly("num_tokens", &dispatch_handle::num_tokens)
      .def_readonly("hidden", &dispatch_handle::hidden)
      .def_readonly("topk", &dispatch_handle::topk)
      .def_readonly("num_recv_tokens", &dispatch_handle::num_recv_tokens)
      .def_readonly("count_matrix", &dispatch_handle::count_matrix);
  bind_normal_buffer<bf16, fp8_e4m3>(m, "NormalBuffer");
  bind_normal_buffer<float>(m, "NormalBuffer_f32");
}

}  // namespace epcomm::python
