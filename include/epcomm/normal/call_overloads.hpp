// call_overloads: the calls a normal-mode host engine derives from its own
// typed dispatch and combine, written once for the flat and the hierarchical
// engine. The engine inherits them (CRTP) and names them with `using` beside
// its own overloads:
// - an argument list in braces has no type to deduce, so dispatch and combine
//   without a type mean the engine's first token type;
// - combine(in, h) allocates its result, the others write the caller's spans.
#pragma once

#include <cstddef>
#include <span>
#include <tuple>

#include "epcomm/core/token_types.hpp"
#include "epcomm/normal/arguments.hpp"

namespace epcomm {

template <class Engine, token_type... Tokens>
class call_overloads {
 public:
  using first_token = std::tuple_element_t<0, std::tuple<Tokens...>>;
  using first_combine = combine_type_t<first_token>;

  dispatch_result<first_token> dispatch(const dispatch_input<first_token>& in,
                                        const dispatch_options& opt = {}) {
    return engine().template dispatch<first_token>(in, opt);
  }

  dispatch_result<first_token> dispatch(const cached_dispatch_input<first_token>& in,
                                        const dispatch_handle& h) {
    return engine().template dispatch<first_token>(in, h);
  }

  void combine(const combine_input<first_combine>& in, const dispatch_handle& h,
               std::span<first_combine> out_x, std::span<float> out_weights = {}) {
    engine().template combine<first_combine>(in, h, out_x, out_weights);
  }

  template <one_of<combine_type_t<Tokens>...> Out>
  combine_result<Out> combine(const combine_input<Out>& in, const dispatch_handle& h) {
    combine_result<Out> out;
    out.x.resize(static_cast<std::size_t>(h.num_tokens) * h.hidden);
    if (in.topk_weights) out.topk_weights.resize(static_cast<std::size_t>(h.num_tokens) * h.topk);
    engine().template combine<Out>(in, h, out.x, out.topk_weights);
    return out;
  }
  combine_result<first_combine> combine(const combine_input<first_combine>& in,
                                        const dispatch_handle& h) {
    return combine<first_combine>(in, h);
  }

 private:
  Engine& engine() { return static_cast<Engine&>(*this); }
};

}  // namespace epcomm
