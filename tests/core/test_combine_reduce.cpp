// The blocked combine reduction against the plain per-channel loop it
// replaces: bit for bit (NaN payloads aside), for every output/row type pair the buffers use,
// hidden sizes around the 64-channel block, 0..9 rows, with and without
// biases, and through NaN, infinities and values that round; once for each
// instruction set this CPU runs (the baseline, AVX2, AVX-512).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "epcomm/core/combine_reduce.hpp"
#include "support/simd_isas.hpp"

using namespace epcomm;

namespace {

template <class Out, class Row>
std::vector<Out> plain(std::size_t hidden, const std::vector<std::vector<Row>>& rows,
                       const std::vector<Out>* bias_0, const std::vector<Out>* bias_1) {
  std::vector<Out> out(hidden);
  for (std::size_t c = 0; c < hidden; ++c) {
    float acc = 0.0f;
    if (bias_0) acc += to_float((*bias_0)[c]);
    if (bias_1) acc += to_float((*bias_1)[c]);
    for (const auto& row : rows) acc += to_float(row[c]);
    out[c] = from_float<Out>(acc);
  }
  return out;
}

// Bit for bit, except that a NaN may carry either operand's payload: which
// one an addition keeps depends on the operand order the compiler picks
// (IEEE 754 leaves it open). bf16 outputs canonicalise every NaN anyway.
template <class Out>
bool same_bits(const std::vector<Out>& got, const std::vector<Out>& want) {
  for (std::size_t c = 0; c < got.size(); ++c) {
    const float g = to_float(got[c]);
    const float w = to_float(want[c]);
    if (std::isnan(g) && std::isnan(w)) continue;
    if (std::memcmp(&got[c], &want[c], sizeof(Out)) != 0) return false;
  }
  return true;
}

template <class T>
T draw(std::mt19937& gen) {
  std::uniform_int_distribution<int> special(0, 63);
  std::normal_distribution<float> value(0.0f, 8.0f);
  switch (special(gen)) {
    case 0:
      return from_float<T>(std::numeric_limits<float>::quiet_NaN());
    case 1:
      return from_float<T>(std::numeric_limits<float>::infinity());
    case 2:
      return from_float<T>(-0.0f);
    case 3:
      return from_float<T>(3.0e38f);  // sums overflow to infinity
    default:
      return from_float<T>(value(gen));
  }
}

template <class Out, class Row>
void check_against_plain(detail::simd_isa isa, std::uint32_t seed) {
  std::mt19937 gen(seed);
  for (std::size_t hidden : {1u, 7u, 63u, 64u, 65u, 128u, 200u, 2048u, 7168u}) {
    for (std::size_t nrows = 0; nrows <= 9; nrows += 3) {
      std::vector<std::vector<Row>> rows(nrows, std::vector<Row>(hidden));
      for (auto& row : rows)
        for (auto& v : row) v = draw<Row>(gen);
      std::vector<Out> b0(hidden), b1(hidden);
      for (auto& v : b0) v = draw<Out>(gen);
      for (auto& v : b1) v = draw<Out>(gen);
      std::vector<const Row*> ptrs;
      for (const auto& row : rows) ptrs.push_back(row.data());
      for (int biases = 0; biases < 3; ++biases) {
        const std::vector<Out>* p0 = biases >= 1 ? &b0 : nullptr;
        const std::vector<Out>* p1 = biases >= 2 ? &b1 : nullptr;
        const auto want = plain<Out, Row>(hidden, rows, p0, p1);
        std::vector<Out> got(hidden);
        detail::reduce_channels_on<Out, Row>(isa, got.data(), hidden, ptrs, nullptr,
                                             p0 ? p0->data() : nullptr, p1 ? p1->data() : nullptr);
        INFO("isa ", static_cast<int>(isa), " hidden ", hidden, " rows ", nrows, " biases ",
             biases);
        CHECK(same_bits(got, want));
      }
    }
  }
}

}  // namespace

TEST_CASE("reduce_token equals the per-channel loop bit for bit, on every instruction set") {
  MESSAGE("instruction sets checked: ", test::runnable_simd_isas().size(), " of 3");
  for (auto isa : test::runnable_simd_isas()) {
    check_against_plain<bf16, bf16>(isa, 1);
    check_against_plain<float, float>(isa, 2);
    check_against_plain<float, bf16>(isa, 3);  // hierarchical partial sums
    check_against_plain<bf16, float>(isa, 4);  // hierarchical final sum
  }
  std::vector<bf16> row(100, bf16{0x3f80}), got(100);
  const bf16* rows[] = {row.data(), row.data()};
  reduce_token<bf16, bf16>(got.data(), got.size(), rows);  // the widest, as the buffers call it
  CHECK(to_float(got[99]) == 2.0f);
}

TEST_CASE(
    "reduce_token_weighted equals the weighted per-channel loop bit for bit, on every "
    "instruction set") {
  for (auto isa : test::runnable_simd_isas()) {
    std::mt19937 gen(5);
    std::normal_distribution<float> weight(0.0f, 1.0f);
    for (std::size_t hidden : {1u, 65u, 128u, 7168u}) {
      for (std::size_t nrows = 0; nrows <= 8; nrows += 4) {
        std::vector<std::vector<bf16>> rows(nrows, std::vector<bf16>(hidden));
        std::vector<float> w(nrows);
        std::vector<const bf16*> ptrs;
        for (std::size_t r = 0; r < nrows; ++r) {
          for (auto& v : rows[r]) v = draw<bf16>(gen);
          w[r] = weight(gen);
          ptrs.push_back(rows[r].data());
        }
        std::vector<bf16> want(hidden), got(hidden);
        for (std::size_t c = 0; c < hidden; ++c) {
          float acc = 0.0f;
          for (std::size_t r = 0; r < nrows; ++r) acc += w[r] * to_float(rows[r][c]);
          want[c] = to_bf16(acc);
        }
        detail::reduce_channels_on<bf16, bf16>(isa, got.data(), hidden, ptrs, w.data(), nullptr,
                                               nullptr);
        INFO("isa ", static_cast<int>(isa), " hidden ", hidden, " rows ", nrows);
        CHECK(same_bits(got, want));
      }
    }
  }
}

TEST_CASE("bias_row is null without a bias and points at token t's row otherwise") {
  const std::vector<float> bias(3 * 4, 1.0f);
  CHECK(bias_row<float>({}, 2, 4) == nullptr);
  CHECK(bias_row<float>(bias, 2, 4) == bias.data() + 8);
}

TEST_CASE("reduce_tokens sums each token's rows, biases and weights in the order it is given") {
  // Token 0 gets rows 2 and 0, token 1 none, token 2 row 1; hidden 3, k 2.
  const std::vector<std::vector<float>> rows = {{1, 2, 3}, {10, 20, 30}, {100, 200, 300}};
  const std::vector<std::vector<float>> weights = {{0.5f, 0.25f}, {1, 2}, {4, 8}};
  const std::vector<std::vector<int>> given = {{2, 0}, {}, {1}};
  const std::vector<float> bias(3 * 3, 1000.0f);
  std::vector<float> out(3 * 3, -1.0f), out_w(3 * 2, -1.0f);
  std::vector<int> asked;
  auto rows_of = [&](int t, auto&& add) {
    asked.push_back(t);
    for (int r : given[t]) add(rows[r].data(), weights[r].data());
  };
  reduce_tokens<float, float>(3, 3, 2, bias, {}, out, out_w, rows_of);
  CHECK(asked == std::vector<int>{0, 1, 2});
  CHECK(out == std::vector<float>{1101, 1202, 1303, 1000, 1000, 1000, 1010, 1020, 1030});
  CHECK(out_w == std::vector<float>{4.5f, 8.25f, 0, 0, 1, 2});

  // Without out_weights, the weights are not read (null here).
  std::vector<float> plain_out(3 * 3);
  reduce_tokens<float, float>(3, 3, 2, {}, {}, plain_out, {}, [&](int t, auto&& add) {
    for (int r : given[t]) add(rows[r].data(), nullptr);
  });
  CHECK(plain_out == std::vector<float>{101, 202, 303, 0, 0, 0, 10, 20, 30});
}
