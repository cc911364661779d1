// The notify header a normal-mode host engine posts at the start of a
// dispatch (flat and hierarchical alike): its status, shape and token type,
// which every rank judges before any row moves (normal/verdict.hpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "epcomm/core/token_types.hpp"
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

}  // namespace epcomm
