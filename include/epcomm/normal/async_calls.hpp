// async_calls: DeepEP's async_finish for a normal-mode host engine. The
// engine inherits dispatch_async and combine_async from it; each queues the
// engine's own call on the engine's communication thread (its call_queue
// member calls_, declared last so that it is destroyed first and its queued
// calls run against a whole engine) and returns a completion. Until it is
// ready the caller must leave the call's inputs (and out_x, out_weights)
// alone. The engine's synchronous calls, dispatch_send_buffer and
// combine_send_buffer first drain the queue, so the engine runs one call at
// a time whichever thread asked, and a result's views of the buffer last, as
// always, until the next dispatch runs.
#pragma once

#include <span>
#include <tuple>
#include <type_traits>

#include "epcomm/core/token_types.hpp"
#include "epcomm/host/call_queue.hpp"
#include "epcomm/host/completion.hpp"
#include "epcomm/normal/arguments.hpp"

namespace epcomm {

template <class Engine, token_type... Tokens>
class async_calls {
  using first_token = std::tuple_element_t<0, std::tuple<Tokens...>>;
  using first_combine = combine_type_t<first_token>;

 public:
  template <one_of<Tokens...> Token>
  completion<dispatch_result<Token>> dispatch_async(const dispatch_input<Token>& in,
                                                    const dispatch_options& opt = {}) {
    Engine& e = engine();
    return e.calls_.submit([&e, in, opt] { return e.template dispatch<Token>(in, opt); });
  }
  completion<dispatch_result<first_token>> dispatch_async(const dispatch_input<first_token>& in,
                                                          const dispatch_options& opt = {}) {
    return dispatch_async<first_token>(in, opt);
  }

  // A dispatch from a cached handle (the engine's dispatch(cached_dispatch_input, h)).
  template <one_of<Tokens...> Token>
  completion<dispatch_result<Token>> dispatch_async(const cached_dispatch_input<Token>& in,
                                                    const dispatch_handle& h) {
    Engine& e = engine();
    return e.calls_.submit([&e, in, h] { return e.template dispatch<Token>(in, h); });
  }
  completion<dispatch_result<first_token>> dispatch_async(
      const cached_dispatch_input<first_token>& in, const dispatch_handle& h) {
    return dispatch_async<first_token>(in, h);
  }

  template <one_of<combine_type_t<Tokens>...> Out>
  completion<void> combine_async(const combine_input<Out>& in, const dispatch_handle& h,
                                 std::type_identity_t<std::span<Out>> out_x,
                                 std::span<float> out_weights = {}) {
    Engine& e = engine();
    return e.calls_.submit(
        [&e, in, h, out_x, out_weights] { e.template combine<Out>(in, h, out_x, out_weights); });
  }
  completion<void> combine_async(const combine_input<first_combine>& in, const dispatch_handle& h,
                                 std::span<first_combine> out_x,
                                 std::span<float> out_weights = {}) {
    return combine_async<first_combine>(in, h, out_x, out_weights);
  }

 private:
  Engine& engine() { return static_cast<Engine&>(*this); }
};

}  // namespace epcomm
