// subgroup_bootstrap (epcomm/bootstrap/subgroup.hpp): splits of a local
// bootstrap into node and rail groups, gathers of different sizes in
// different groups at once, a split that cannot describe its nodes, and shm
// transports brought up over each kind of group.
#include "epcomm/bootstrap/subgroup.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "epcomm/bootstrap/local.hpp"
#include "epcomm/shm/transport.hpp"
#include "support/run_case.hpp"

using namespace epcomm;

namespace {

static_assert(bootstrap<subgroup_bootstrap<local_bootstrap>>);

deadline soon() { return deadline::after(std::chrono::seconds(30)); }

int fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return 1;
}

local_launch_options nodes_of(int per_node) {
  local_launch_options opt;
  opt.ranks_per_node = per_node;
  return opt;
}

}  // namespace

TEST_CASE("node and rail splits number ranks and describe nodes") {
  // 6 ranks as 3 nodes of 2.
  const auto codes = launch_local(
      6,
      [](local_bootstrap& boot) {
        const int rank = boot.rank();
        subgroup_bootstrap<local_bootstrap> node(boot, rank / 2, "node", soon());
        subgroup_bootstrap<local_bootstrap> rail(boot, rank % 2, "rail", soon());
        subgroup_bootstrap<local_bootstrap> rail_one(boot, rank % 2, "rail1", soon(),
                                                     subgroup_locality::one_node);
        auto expect = [&](const char* what, int got, int want) {
          if (got != want)
            throw error(rank, what, no_peer,
                        "got " + std::to_string(got) + ", want " + std::to_string(want));
        };
        expect("node rank", node.rank(), rank % 2);
        expect("node size", node.world_size(), 2);
        expect("node local rank", node.local_rank(), rank % 2);
        expect("node local size", node.local_world_size(), 2);
        expect("rail rank", rail.rank(), rank / 2);
        expect("rail size", rail.world_size(), 3);
        expect("rail local rank", rail.local_rank(), 0);
        expect("rail local size", rail.local_world_size(), 1);
        expect("one-node rail local rank", rail_one.local_rank(), rank / 2);
        expect("one-node rail local size", rail_one.local_world_size(), 3);
        for (int i = 0; i < 3; ++i) expect("rail member", rail.members()[i], 2 * i + rank % 2);
        const std::string tag = boot.job_tag();
        if (node.job_tag() != tag + "-node" + std::to_string(rank / 2) ||
            rail.job_tag() != tag + "-rail" + std::to_string(rank % 2))
          return fail(rank, "job tags " + node.job_tag() + ", " + rail.job_tag());
        node.barrier(soon());
        rail.barrier(soon());
        return 0;
      },
      nodes_of(2));
  CHECK(test::all_ok(codes, "node and rail splits"));
}

TEST_CASE("groups gather blocks of their own size at the same time") {
  // Ranks 0-1 form one group gathering 3-byte blocks, ranks 2-5 another
  // gathering 1000-byte blocks; then an empty gather, twice over.
  const auto codes = launch_local(
      6,
      [](local_bootstrap& boot) {
        const int rank = boot.rank();
        const int colour = rank < 2 ? 0 : 1;
        subgroup_bootstrap<local_bootstrap> group(boot, colour, "g", soon());
        const std::size_t size = colour == 0 ? 3 : 1000;
        for (int round = 0; round < 2; ++round) {
          std::vector<std::byte> mine(size);
          for (std::size_t i = 0; i < size; ++i)
            mine[i] = static_cast<std::byte>(rank * 37 + i * 11 + round);
          const auto all = group.all_gather(mine, soon());
          if (all.size() != size * group.world_size()) return fail(rank, "gathered size");
          for (int r = 0; r < group.world_size(); ++r) {
            const int from = group.members()[r];
            for (std::size_t i = 0; i < size; ++i)
              if (all[r * size + i] != static_cast<std::byte>(from * 37 + i * 11 + round))
                return fail(rank, "byte " + std::to_string(i) + " of member " + std::to_string(r));
          }
          if (!group.all_gather({}, soon()).empty()) return fail(rank, "empty gather");
        }
        return 0;
      },
      nodes_of(2));
  CHECK(test::all_ok(codes, "gathers of different sizes"));
}

TEST_CASE("members of one group that disagree on a block size fail with the peer named") {
  const auto codes = launch_local(
      2,
      [](local_bootstrap& boot) {
        const int rank = boot.rank();
        subgroup_bootstrap<local_bootstrap> group(boot, 0, "g", soon());
        std::vector<std::byte> mine(rank == 0 ? 8 : 16);
        try {
          group.all_gather(mine, soon());
        } catch (const error& e) {
          return std::string(e.what()).find("block sizes disagree") != std::string::npos &&
                         e.peer() == 1 - rank
                     ? 0
                     : fail(rank, e.what());
        }
        return fail(rank, "mismatched blocks gathered");
      },
      nodes_of(2));
  CHECK(test::all_ok(codes, "block size mismatch"));
}

TEST_CASE("a split that leaves nodes unevenly filled fails on every rank, unless one node") {
  // 6 ranks as 2 nodes of 3; colour 1 = ranks 0, 3, 4 (one on node 0, two on node 1).
  const auto codes = launch_local(
      6,
      [](local_bootstrap& boot) {
        const int rank = boot.rank();
        const int colour = rank == 0 || rank == 3 || rank == 4 ? 1 : 0;
        try {
          subgroup_bootstrap<local_bootstrap> group(boot, colour, "g", soon());
          return fail(rank, "uneven split accepted");
        } catch (const error& e) {
          if (std::string(e.what()).find("spread unevenly") == std::string::npos)
            return fail(rank, e.what());
        }
        subgroup_bootstrap<local_bootstrap> group(boot, colour, "g", soon(),
                                                  subgroup_locality::one_node);
        return group.local_world_size() == group.world_size() ? 0 : fail(rank, "one node");
      },
      nodes_of(3));
  CHECK(test::all_ok(codes, "uneven split"));
}

TEST_CASE("shm transports come up over node groups and over a one-node rail") {
  // 4 ranks as 2 nodes of 2: the node transport maps its node only; a rail
  // transport declared one node maps the whole rail (one host here), and
  // stores land in the peers' buffers.
  const auto codes = launch_local(
      4,
      [](local_bootstrap& boot) {
        const int rank = boot.rank();
        subgroup_bootstrap<local_bootstrap> node(boot, rank / 2, "node", soon());
        shm::transport intra(node, 4096, 2, soon());
        subgroup_bootstrap<local_bootstrap> rail(boot, rank % 2, "rail", soon(),
                                                 subgroup_locality::one_node);
        shm::transport inter(rail, 4096, 2, soon());
        for (auto* t : {&intra, &inter}) {
          if (t->world_size() != 2) return fail(rank, "group transport size");
          for (int p = 0; p < 2; ++p)
            if (!t->is_peer_mapped(p)) return fail(rank, "member not mapped");
          const int peer = 1 - t->rank();
          *reinterpret_cast<int*>(t->peer_ptr(peer, 0)) = rank;
          t->signal_add(peer, 0, 1);
          t->wait(0, 1, soon(), {"subgroup test", peer, "store"});
        }
        if (*reinterpret_cast<int*>(intra.local_buffer().data()) != (rank ^ 1) ||
            *reinterpret_cast<int*>(inter.local_buffer().data()) != (rank ^ 2))
          return fail(rank, "stores landed in the wrong buffer");
        intra.barrier(soon());
        inter.barrier(soon());
        return 0;
      },
      nodes_of(2));
  CHECK(test::all_ok(codes, "shm over groups"));
}
