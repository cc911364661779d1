// The headers a normal-mode host engine (flat and hierarchical alike) posts
// at the start of a call: a dispatch's notify header (status, shape, token
// type; a cached dispatch's also its handle's routing) and a combine's status
// header, which every rank judges before any row moves (normal/verdict.hpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "epcomm/core/token_types.hpp"
#include "epcomm/normal/arguments.hpp"
#include "epcomm/normal/wire.hpp"

namespace epcomm {

// `cause` empty: an accepted input; else why this rank rejects the call.
// recv_bound and routing stay 0 for the caller to set.
template <token_type Token>
wire::notify_header notify_header_of(const std::string& cause, std::uint64_t epoch, int num_tokens,
                                     int hidden, int topk, int num_experts) {
  wire::notify_header hdr{};
  hdr.magic = wire::magic;
  hdr.state = cause.empty() ? wire::status::ok : wire::status::invalid_input;
  hdr.epoch = epoch;
  hdr.num_tokens = num_tokens;
  hdr.hidden = hidden;
  hdr.topk = topk;
  hdr.num_experts = num_experts;
  hdr.token_id = token_traits<Token>::id;
  std::strncpy(hdr.cause, cause.c_str(), sizeof(hdr.cause) - 1);
  return hdr;
}

// A dispatch from the cached handle `h`: the handle's shape and routing, no
// top-k; `cause` as above (when it is set, `h` may be malformed and is not
// read).
template <token_type Token>
wire::notify_header cached_notify_header_of(const std::string& cause, std::uint64_t epoch,
                                            int num_experts, const dispatch_handle& h) {
  const bool ok = cause.empty();
  wire::notify_header hdr = notify_header_of<Token>(cause, epoch, ok ? h.num_tokens : 0,
                                                    ok ? h.hidden : 0, 0, num_experts);
  hdr.routing = ok ? h.routing() : 0;
  return hdr;
}

// `cause` empty: an accepted combine along `h` (whose routing it carries);
// else why this rank rejects it (`h` may then be malformed and is not read).
// in_place stays 0 for the caller to set.
template <class Out>
wire::combine_header combine_header_of(const std::string& cause, std::uint64_t epoch,
                                       bool with_weights, const dispatch_handle& h) {
  wire::combine_header hdr{};
  hdr.epoch = epoch;
  hdr.state = cause.empty() ? wire::status::ok : wire::status::invalid_input;
  hdr.with_weights = with_weights ? 1 : 0;
  hdr.out_id = token_traits<Out>::id;
  hdr.routing = cause.empty() ? h.routing() : 0;
  std::strncpy(hdr.cause, cause.c_str(), sizeof(hdr.cause) - 1);
  return hdr;
}

}  // namespace epcomm
