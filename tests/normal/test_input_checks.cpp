// normal/input_checks.hpp: the words every normal-mode engine (flat,
// hierarchical, the device buffer's host side) rejects a call's arguments
// with. The engines' own tests (test_bad_input, the hierarchical suite) check
// that a rejection reaches every rank; this one pins each text, since a
// framework's logs and our docs quote them.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "epcomm/normal/input_checks.hpp"

using namespace epcomm;

namespace {

// 2 ranks, 8 experts, hidden <= 256, topk <= 4, 8 tokens, 16 receivable rows.
const wire::capacity cap{2, 8, 256, 4, 8, 16, 16, 2, 2, true, 0};

struct tokens {
  int t, h, k;
  std::vector<bf16> x = std::vector<bf16>(static_cast<std::size_t>(t) * h);
  std::vector<std::int64_t> idx = std::vector<std::int64_t>(static_cast<std::size_t>(t) * k, 0);
  std::vector<float> w = std::vector<float>(static_cast<std::size_t>(t) * k);
  dispatch_input<bf16> input() const { return {t, h, k, x, {}, idx, w}; }
};

dispatch_handle handle(int tokens, int hidden, int topk) {
  // Rank 1's handle of a dispatch in which it sent every token to rank 0 and
  // received none (num_recv_tokens 0).
  dispatch_handle h{{2, 1, tokens, hidden, topk}, 0, {0, 0, tokens, 0}, {}};
  for (int t = 0; t < tokens; ++t) h.send_pos.insert(h.send_pos.end(), {t, -1});
  return h;
}

}  // namespace

TEST_CASE("dispatch arguments are checked against the buffer, in one wording") {
  const tokens ok{4, 128, 2};
  CHECK(check_dispatch_input(ok.input(), {}, cap).empty());
  CHECK(check_dispatch_bounds(cap, false, 9, 128, 2) ==
        "9 tokens exceed the buffer's max_tokens_per_rank 8");
  CHECK(check_dispatch_bounds(cap, false, -1, 128, 2) == "num_tokens is negative");
  CHECK(check_dispatch_bounds(cap, false, 4, 257, 2) == "hidden 257 is outside [1, 256]");
  CHECK(check_dispatch_bounds(cap, true, 4, 100, 2) ==
        "hidden 100 is not a multiple of 128 (fp8 scales)");
  CHECK(check_dispatch_bounds(cap, false, 4, 100, 2).empty());  // bf16 needs no scales
  CHECK(check_dispatch_bounds(cap, false, 4, 128, 5) == "topk 5 is outside [1, 4]");

  auto in = ok.input();
  in.x = in.x.first(7);
  CHECK(check_dispatch_input(in, {}, cap) == "x holds 7 elements, expected T*H = 512");
  in = ok.input(), in.topk_idx = in.topk_idx.first(3);
  CHECK(check_dispatch_input(in, {}, cap) == "topk_idx holds 3 ids, expected T*K = 8");
  in = ok.input(), in.topk_weights = {};
  CHECK(check_dispatch_input(in, {}, cap) == "topk_weights holds 0 values, expected T*K = 8");
  CHECK(check_dispatch_input(ok.input(), {17, 1}, cap) ==
        "worst_case_recv_tokens 17 is outside [0, max_recv_tokens 16]");
  tokens bad_expert = ok;
  bad_expert.idx[5] = 8;
  CHECK(check_dispatch_input(bad_expert.input(), {}, cap) ==
        "topk_idx[2][1] = 8 is outside [-1, 8)");

  CHECK(check_rows<fp8_e4m3>(4 * 256, 7, 4, 256) == "x_scales holds 7 values, expected 8");
  CHECK(check_rows<fp8_e4m3>(4 * 256, 8, 4, 256).empty());
  CHECK(check_rows<bf16>(4 * 256, 1, 4, 256) == "x_scales holds 1 values, expected 0");
}

TEST_CASE("a cached dispatch and a combine are checked against their handle") {
  const dispatch_handle h = handle(4, 256, 2);
  const std::vector<fp8_e4m3> x(4 * 256);
  const std::vector<float> scales(4 * 2);
  CHECK(check_cached_dispatch_input<fp8_e4m3>({x, scales}, h, 1, cap).empty());
  CHECK(check_cached_dispatch_input<fp8_e4m3>({x, {}}, h, 1, cap) ==
        "x_scales holds 0 values, expected 8");
  CHECK(check_cached_dispatch_input<fp8_e4m3>({x, scales}, h, 0, cap) ==
        "handle belongs to rank 1 of a world of 2");
  dispatch_handle odd = h;
  odd.hidden = 200;
  CHECK(check_cached_dispatch_input<fp8_e4m3>({x, scales}, odd, 1, cap) ==
        "hidden 200 is not a multiple of 128 (fp8 scales)");
  odd = h, odd.count_matrix.pop_back();
  CHECK(check_own_handle(odd, 1, cap) ==
        "handle is malformed (not one this buffer's dispatch returned)");

  // Rank 1 received nothing (num_recv_tokens 0): y may be empty or longer.
  const std::vector<bf16> y(2 * 256);
  const std::vector<float> yw(2 * 2);
  std::vector<bf16> out(4 * 256);
  std::vector<float> out_w(4 * 2);
  const auto check = [&](const combine_input<bf16>& in, std::span<const bf16> o,
                         std::span<const float> ow) {
    return check_combine_input<bf16>(in, h, o, ow, 1, cap);
  };
  CHECK(check({y, yw, {}, {}}, out, out_w).empty());
  CHECK(check({std::span(y).first(300), {}, {}, {}}, out, {}) ==
        "y holds 300 elements, expected N*H with N >= 0 rows of 256");
  CHECK(check({y, std::span(yw).first(3), {}, {}}, out, out_w) ==
        "topk_weights holds 3 values, expected 4 (rows of y times topk)");
  CHECK(check({y, {}, std::span(y).first(256), {}}, out, {}) ==
        "bias holds 256 elements, expected T*H = 1024");
  CHECK(check({y, {}, {}, {}}, std::span(out).first(5), {}) ==
        "output holds 5 elements, expected T*H = 1024");
  CHECK(check({y, yw, {}, {}}, out, std::span(out_w).first(7)) ==
        "output weights hold 7 values, expected T*K = 8");
  CHECK(check({y, {}, {}, {}}, out, {}).empty());  // no weights in, none out
}
