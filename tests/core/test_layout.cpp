// Layout and topology validation: pure functions, checked on hand-made cases
// where the answer is known, and on invariants over random routings.
#include <doctest/doctest.h>

#include <numeric>

#include "epcomm/core/layout.hpp"
#include "epcomm/core/topology.hpp"
#include "support/workload.hpp"

using namespace epcomm;

TEST_CASE("a token goes once to each rank owning one of its experts") {
  const topology topo{2, 2, 4, 128, 3};  // experts 0,1 on rank 0; 2,3 on rank 1
  const std::vector<std::int64_t> idx = {
      0,  1,  -1,  // token 0: twice on rank 0 -> sent once
      2,  -1, 0,   // token 1: ranks 1 and 0
      -1, -1, -1,  // token 2: nowhere
      3,  3,  2,   // token 3: rank 1 only
  };
  const layout lay = make_layout(topo, idx, 4);
  CHECK(lay.tokens_per_rank == std::vector<int>{2, 2});
  CHECK(lay.tokens_per_expert == std::vector<int>{2, 1, 2, 2});
  CHECK(lay.position(0, 0) == 0);
  CHECK(lay.position(0, 1) == -1);
  CHECK(lay.position(1, 0) == 1);
  CHECK(lay.position(1, 1) == 0);
  CHECK_FALSE(lay.in_rank(2, 0));
  CHECK_FALSE(lay.in_rank(2, 1));
  CHECK(lay.position(3, 1) == 1);
}

TEST_CASE("local expert ids and destination ranks") {
  CHECK(destination_rank(-1, 4) == -1);
  CHECK(destination_rank(0, 4) == 0);
  CHECK(destination_rank(7, 4) == 1);
  CHECK(local_expert_id(7, 1, 4) == 3);
  CHECK(local_expert_id(7, 0, 4) == -1);
  CHECK(local_expert_id(-1, 0, 4) == -1);
}

TEST_CASE("layout invariants over random routings") {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    test::shape s{4, 300, 128, 1 + static_cast<int>(seed % 8), 32, test::routing::uneven, seed};
    const topology topo{s.world, s.world, s.experts, s.hidden, s.topk};
    const auto idx = test::make_routing(s, 0);
    const layout lay = make_layout(topo, idx, s.tokens);
    for (int r = 0; r < s.world; ++r) {
      // Positions towards r are 0..count-1, increasing with the token index.
      int next = 0;
      for (int t = 0; t < s.tokens; ++t)
        if (lay.in_rank(t, r)) CHECK(lay.position(t, r) == next++);
      CHECK(next == lay.tokens_per_rank[r]);
    }
    const int entries =
        static_cast<int>(std::count_if(idx.begin(), idx.end(), [](auto e) { return e >= 0; }));
    CHECK(std::accumulate(lay.tokens_per_expert.begin(), lay.tokens_per_expert.end(), 0) ==
          entries);
  }
}

TEST_CASE("invalid expert ids are reported with their position") {
  const std::vector<std::int64_t> idx = {0, 1, 2, 8, -1, -2};
  const auto bad = find_invalid_expert(idx, 2, 8);
  REQUIRE(bad.has_value());
  CHECK(*bad == "topk_idx[1][1] = 8 is outside [-1, 8)");
  CHECK_FALSE(find_invalid_expert(std::span(idx).first(3), 3, 8).has_value());
  const std::vector<std::int64_t> neg = {-2};
  CHECK(find_invalid_expert(neg, 1, 8).value().find("-2") != std::string::npos);
}

TEST_CASE("topology validation names what is wrong") {
  auto message = [](topology t) {
    try {
      t.validate(3, "setup");
    } catch (const error& e) {
      CHECK(e.rank() == 3);
      CHECK(e.op() == "setup");
      return e.cause();
    }
    return std::string("accepted");
  };
  CHECK(message({4, 2, 8, 128, 2}) == "accepted");
  CHECK(message({4, 3, 8, 128, 2}).find("ranks_per_node (3) must divide world_size (4)") == 0);
  CHECK(message({4, 4, 6, 128, 2}).find("num_experts (6) must be a positive multiple") == 0);
  CHECK(message({4, 4, 8, 0, 2}).find("hidden") == 0);
  CHECK(message({4, 4, 8, 128, 9}).find("topk") == 0);
  CHECK(message({0, 1, 8, 128, 2}).find("world_size") == 0);
  const topology t{8, 4, 64, 7168, 8};
  CHECK(t.experts_per_rank() == 8);
  CHECK(t.num_nodes() == 2);
  CHECK(t.node_of(5) == 1);
  CHECK(t.local_index(5) == 1);
  CHECK(t.owner_of(63) == 7);
}

TEST_CASE("errors carry rank, operation, peer and cause") {
  const error e(2, "dispatch", 3, "deadline expired");
  CHECK(std::string(e.what()) == "epcomm: rank 2: dispatch (peer 3): deadline expired");
  CHECK(e.peer() == 3);
  const error n(0, "combine", no_peer, "bad y");
  CHECK(std::string(n.what()) == "epcomm: rank 0: combine: bad y");
}
