// The low-latency suite (tests/support/ll_suite.hpp) over shared memory: every
// case, at full size; and the wire plan with and without RMA staging. The RMA
// transports run the suite's RMA subset in test_low_latency_libfabric.cpp and
// test_low_latency_ucx.cpp.
#include "epcomm/shm/transport.hpp"
#include "support/ll_suite.hpp"

TYPE_TO_STRING(epcomm::shm::transport);
EPCOMM_LL_SUITE(epcomm::shm::transport);

// The RMA path's staging must leave every offset the peer-mapped engine and
// the CUDA port use where it was, and fit inside each parity.
TEST_CASE("staging regions are appended to each parity, the rest unchanged") {
  using epcomm::wire::ll::plan;
  for (const auto& s : {epcomm::wire::ll::shape{1, 8, 2048, 8, 256, 2, false},
                        epcomm::wire::ll::shape{3, 9, 7168, 8, 128, 1, true},
                        epcomm::wire::ll::shape{4, 16, 128, 1, 1, 1, true}}) {
    const plan a = epcomm::wire::ll::plan_buffer(s);
    const plan b = epcomm::wire::ll::plan_buffer(s, true);
    CHECK(b.dispatch_counts == a.dispatch_counts);
    CHECK(b.combine_counts == a.combine_counts);
    CHECK(b.rejects == a.rejects);
    CHECK(b.dispatch_recv == a.dispatch_recv);
    CHECK(b.combine_recv == a.combine_recv);
    CHECK(b.combine_send == a.combine_send);
    CHECK(b.recv_x == a.recv_x);
    CHECK(b.recv_scales == a.recv_scales);
    CHECK(b.recv_src == a.recv_src);
    CHECK(b.recv_range == a.recv_range);
    CHECK(b.recv_count == a.recv_count);
    CHECK(b.sent_topk_idx == a.sent_topk_idx);
    CHECK(b.combine_weights == a.combine_weights);
    CHECK(b.combine_out == a.combine_out);
    CHECK(a.send_records == 0);
    CHECK(a.send_rejects == 0);
    // In order after everything else, each large enough, inside the parity.
    const std::size_t records = static_cast<std::size_t>(s.num_experts) * s.max_tokens_per_rank *
                                epcomm::wire::ll::record_bytes(s);
    CHECK(b.send_records >= a.parity_bytes);
    CHECK(b.send_dispatch_counts >= b.send_records + records);
    CHECK(b.send_combine_counts >=
          b.send_dispatch_counts + s.num_experts * sizeof(epcomm::wire::ll::count_word));
    CHECK(b.send_rejects >=
          b.send_combine_counts + s.world_size * sizeof(epcomm::wire::ll::count_word));
    CHECK(b.parity_bytes >= b.send_rejects + 2 * sizeof(epcomm::wire::ll::reject_record));
    CHECK(b.total == 2 * b.parity_bytes);
  }
}

// A buffer serving bf16 and fp8 lays each call's records out in the call's
// wire, inside regions that are the buffer's: ranks that disagree on a call's
// wire (every rank then rejects the call) still write disjoint bytes, each
// region only its own source's, however many records it holds.
TEST_CASE("records of either wire stay inside their own (expert, source) region") {
  namespace ll = epcomm::wire::ll;
  const ll::shape both{3, 6, 256, 4, 16, 2, true};
  const ll::plan pl = ll::plan_buffer(both);
  for (const ll::shape& cs :
       {ll::call_shape<epcomm::bf16>(both), ll::call_shape<epcomm::fp8_e4m3>(both)}) {
    CAPTURE(cs.wire_bytes);
    for (int le = 0; le < both.local_experts(); ++le)
      for (int src = 0; src < both.world_size; ++src) {
        const std::size_t region =
            (static_cast<std::size_t>(le) * both.world_size + src) * pl.record_region_bytes;
        const std::size_t first = ll::record_offset(cs, pl, le, src, 0);
        const std::size_t end =
            ll::record_offset(cs, pl, le, src, both.max_tokens_per_rank - 1) + ll::record_bytes(cs);
        CHECK(first == region);
        CHECK(end <= region + pl.record_region_bytes);
      }
  }
  CHECK(pl.record_region_bytes ==
        static_cast<std::size_t>(both.max_tokens_per_rank) * ll::record_bytes(both));
}
