// Low-latency combine on the device, in the host engine's wire format, as two
// kernels a framework can launch apart:
//
//   send     every block first checks the call (the dispatch it answers was
//            delivered, topk_idx is what was dispatched: sent_topk_idx); then
//            one warp per received row stores the expert output y[row]
//            straight into slot (token, top-k slot) of its source's combine
//            region, and the weights are kept for the receive phase. The last
//            block writes each source's count word (rows sent there, or
//            "rejected" after the reject records) and signals it (release).
//            Over an RMA transport rows for other ranks are put by the proxy
//            from combine_send (copied there unless y is it), then the count
//            words, by the last block's thread 0 (low_latency/route.hpp).
//   receive  every block waits for every expert rank's signal and reads its
//            count word; then one block per token sums the routed rows times
//            their weights in top-k slot order, in fp32 (weighted_add: never
//            fused), rounded to bf16 once: the host engine's bits. The last
//            block judges the call (combine_verdict) and updates the stats.
//
// With mask_lost_ranks a rank that exited gets no rows and, once the kernels
// find it gone, its experts' contributions are left out: lost_peers.cuh.
#pragma once

#include <climits>
#include <cstring>

#include "epcomm/low_latency/cuda/kernel_parts.cuh"

namespace epcomm::cuda::device {

// Grid: ll_combine_send_blocks; dynamic shared memory: (E_local + 1) ints.
template <int Hidden>
__global__ void __launch_bounds__(ll_threads)
    ll_combine_send_kernel(const __grid_constant__ ll_args a) {
  extern __shared__ int first_row[];         // [E_local + 1] packed rows before each local expert
  __shared__ unsigned long long first_diff;  // lowest topk_idx entry that differs
  __shared__ ll_gone gone;
  const auto [rep, s, world, rank, p, warp, lane] = ll_thread_of(a);
  if (block_is_broken(rep)) return;
  const int el = s.local_experts();
  const int k = a.topk;
  const std::uint64_t epoch = a.ws.combine_epoch[p] + 1;
  const bool dispatched = a.ws.dispatch_ok[p] != 0;
  const auto* sent =
      reinterpret_cast<const std::int64_t*>(ll_region(a, rank, a.plan.sent_topk_idx));

  if (threadIdx.x == 0) first_diff = ULLONG_MAX;
  __syncthreads();
  const long long entries = static_cast<long long>(a.num_tokens) * k;
  for (long long i = threadIdx.x; i < entries; i += blockDim.x)
    if (a.topk_idx[i] !=
        sent[wire::ll::combine_row(s, static_cast<int>(i / k), static_cast<int>(i % k))])
      atomicMin(&first_diff, static_cast<unsigned long long>(i));
  // Rows are numbered over all local experts; first_row is the exclusive
  // prefix sum of recv_count (meaningful only when the dispatch was delivered).
  if (warp == 0) {
    const auto* recv_count =
        reinterpret_cast<const std::int32_t*>(ll_region(a, rank, a.plan.recv_count));
    int carry = 0;
    for (int c = 0; c < el; c += warp_size) {
      const int le = c + lane;
      const int n = dispatched && le < el ? recv_count[le] : 0;
      int inclusive = n;
#pragma unroll
      for (int o = 1; o < warp_size; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inclusive, o);
        if (lane >= o) inclusive += v;
      }
      if (le < el) first_row[le] = carry + inclusive - n;
      carry += __shfl_sync(0xffffffffu, inclusive, warp_size - 1);
    }
    if (lane == 0) first_row[el] = carry;
  }
  ll_look_for_exits(a, gone);  // its barrier also publishes first_row
  const bool valid = a.host_cause[0] == '\0' && dispatched && first_diff == ULLONG_MAX;

  if (valid) {
    const int hidden = ll_hidden(a, Hidden);
    const std::size_t row_bytes = static_cast<std::size_t>(hidden) * sizeof(bf16);
    const auto* from_of =
        reinterpret_cast<const wire::ll::source*>(ll_region(a, rank, a.plan.recv_src));
    const int total = first_row[el];
    for (int g = blockIdx.x * ll_warps + warp; g < total; g += gridDim.x * ll_warps) {
      int lo = 0, hi = el;  // first_row[lo] <= g < first_row[hi]
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (first_row[mid] <= g)
          lo = mid;
        else
          hi = mid;
      }
      const std::size_t row =
          static_cast<std::size_t>(lo) * s.rows_per_expert() + (g - first_row[lo]);
      const wire::ll::source from = from_of[row];
      if (gone.skipped[from.rank]) continue;  // a lost rank's rows are not sent
      std::byte* dst = ll_region(a, from.rank, a.plan.combine_recv) +
                       wire::ll::combine_row(s, from.token, from.topk_slot) * row_bytes;
      if (a.route.via_proxy != 0 && from.rank != rank) {
        // The proxy puts the row from combine_send, where a zero-copy
        // caller already wrote it.
        dst = ll_region(a, rank, a.plan.combine_send) + row * row_bytes;
        if (reinterpret_cast<const std::byte*>(a.y) == ll_region(a, rank, a.plan.combine_send))
          continue;
      }
      const auto* y = reinterpret_cast<const std::byte*>(a.y) + row * row_bytes;
      if constexpr (Hidden > 0)
        group_copy<static_cast<std::size_t>(Hidden) * sizeof(bf16), warp_size>(dst, y, lane);
      else
        group_copy(dst, y, row_bytes, lane, warp_size);
    }
    // Kept for the receive phase, so the caller's weights need not outlive
    // the send phase.
    auto* weights = reinterpret_cast<float*>(ll_region(a, rank, a.plan.combine_weights));
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < entries;
         i += static_cast<long long>(gridDim.x) * blockDim.x)
      weights[wire::ll::combine_row(s, static_cast<int>(i / k), static_cast<int>(i % k))] =
          a.topk_weights[i];
  }

  const int kernel = static_cast<int>(ll_kernel::combine_send);
  if (!ll_last_block(a.ws.blocks_done + kernel * wire::ll::parities + p)) return;
  if (!valid)
    post_reject_records(a, wire::ll::reject_kind::combine, epoch, [&](char* cause) {
      if (a.host_cause[0] != '\0')
        copy_cause(cause, a.host_cause);
      else if (!dispatched)
        // The host engine's words for a handle whose dispatch was rejected.
        cause_text(cause, wire::cause_bytes)
            << "handle is stale: it names dispatch "
            << static_cast<long long>(a.ws.dispatch_epoch[a.parity]) << " of parity "
            << static_cast<long long>(a.parity) << ", whose outputs a later dispatch replaced";
      else
        cause_text(cause, wire::cause_bytes)
            << "topk_idx[" << static_cast<long long>(first_diff / k) << "]["
            << static_cast<long long>(first_diff % k) << "] differs from the dispatched id";
    });
  const auto* ranges =
      reinterpret_cast<const wire::ll::range*>(ll_region(a, rank, a.plan.recv_range));
  for (int r = threadIdx.x; r < world; r += blockDim.x) {
    if (gone.skipped[r]) continue;
    int rows = 0;
    if (valid)
      for (int le = 0; le < el; ++le)
        rows += ranges[static_cast<std::size_t>(le) * world + r].count;
    const wire::ll::count_word w{epoch, rows,
                                 valid ? wire::ll::state::ok : wire::ll::state::rejected,
                                 token_traits<bf16>::id};
    if (a.route.via_proxy != 0)
      *reinterpret_cast<wire::ll::count_word*>(
          ll_own_buffer(a) + wire::ll::combine_count_write(s, a.plan, p, rank, r).local) = w;
    else
      publish_count(
          ll_region(a, r, a.plan.combine_counts) + static_cast<std::size_t>(rank) * sizeof w,
          ll_signal(a, r, wire::ll::combine_signal(s, p, rank)), w);
  }
  if (a.route.via_proxy != 0) {
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
      proxy::channel_writer ch = a.route.parity[p].writer();  // one run: rows, then words
      const bool rows_out =
          !valid ||
          ll_channel_ok(
              rep, abort_link_of(a), ll_op::combine,
              ll_push::combine_rows(
                  ch, s, a.plan, p, rank,
                  reinterpret_cast<const std::int32_t*>(ll_region(a, rank, a.plan.recv_count)),
                  reinterpret_cast<const wire::ll::source*>(ll_region(a, rank, a.plan.recv_src))));
      if (rows_out)
        ll_channel_ok(rep, abort_link_of(a), ll_op::combine,
                      ll_push::combine_counts(ch, s, a.plan, p, rank, !valid));
    }
  }
  if (threadIdx.x == 0) {
    a.ws.combine_epoch[p] = epoch;
    a.ws.combine_ok[p] = valid ? 1 : 0;
  }
}

// Block: out[t] = sum over routed slots j of weight[t][j] * row(t, j), in
// slot order, in fp32, rounded to bf16 once; a slot whose expert's rank was
// lost is left out (and counted), as if its weight were 0. `rows` / `w` are
// shared arrays of max_topk entries.
template <int Hidden>
__device__ void reduce_ll_token(const ll_args& a, int t, const std::byte** rows, float* w) {
  const wire::ll::shape& s = a.shape;
  const int rank = a.peers.rank;
  const int k = a.topk;
  const int hidden = ll_hidden(a, Hidden);
  const std::size_t row_bytes = static_cast<std::size_t>(hidden) * sizeof(bf16);
  const auto* sent =
      reinterpret_cast<const std::int64_t*>(ll_region(a, rank, a.plan.sent_topk_idx));
  const auto* weights = reinterpret_cast<const float*>(ll_region(a, rank, a.plan.combine_weights));
  const std::byte* returned = ll_region(a, rank, a.plan.combine_recv);
  const std::uint64_t epoch = a.ws.combine_epoch[a.parity];
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    const std::size_t slot = wire::ll::combine_row(s, t, j);
    const std::int64_t e = sent[slot];
    const bool lost =
        e >= 0 && ll_lost_in(a, ll_part::combine, static_cast<int>(e / s.local_experts()), epoch);
    if (lost) atomicAdd(reinterpret_cast<unsigned long long*>(a.ws.masked_contributions), 1ull);
    rows[j] = e >= 0 && !lost ? returned + slot * row_bytes : nullptr;
    w[j] = weights[slot];
  }
  __syncthreads();
  bf16* out = a.out + static_cast<std::size_t>(t) * hidden;
  if (Hidden > 0 || ((reinterpret_cast<std::uintptr_t>(out) | row_bytes) & 15u) == 0) {
    const int vectors = hidden / 8;
    for (int v = threadIdx.x; v < vectors; v += ll_threads) {
      float acc[8] = {};
      for (int j = 0; j < k; ++j) {
        if (rows[j] == nullptr) continue;
        const int4 in = reinterpret_cast<const int4*>(rows[j])[v];
        bf16 e[8];
        std::memcpy(e, &in, sizeof in);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = weighted_add(acc[i], w[j], to_float(e[i]));
      }
      bf16 o[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = to_bf16(acc[i]);
      int4 packed;
      std::memcpy(&packed, o, sizeof packed);
      reinterpret_cast<int4*>(out)[v] = packed;
    }
  } else {
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j < k; ++j)
        if (rows[j] != nullptr)
          acc = weighted_add(acc, w[j], to_float(reinterpret_cast<const bf16*>(rows[j])[c]));
      out[c] = to_bf16(acc);
    }
  }
  __syncthreads();  // rows and w are reused by the next token
}

// The last receive block: judges the call from every count word, with the
// rows each expert rank owes counted from what this rank dispatched, records
// the verdict, and updates the stats.
__device__ inline void finish_combine(const ll_args& a, std::uint64_t epoch, bool self_ok) {
  __shared__ int expected[peer_table::max_ranks];
  __shared__ int first_violation, first_rejecting;
  const wire::ll::shape& s = a.shape;
  const int world = s.world_size;
  const int rank = a.peers.rank;
  const int k = a.topk;
  const int per_rank = s.local_experts();
  const auto* words =
      reinterpret_cast<const wire::ll::count_word*>(ll_region(a, rank, a.plan.combine_counts));
  const auto* sent =
      reinterpret_cast<const std::int64_t*>(ll_region(a, rank, a.plan.sent_topk_idx));
  for (int r = threadIdx.x; r < world; r += blockDim.x) expected[r] = 0;
  if (threadIdx.x == 0) first_violation = first_rejecting = INT_MAX;
  __syncthreads();
  const long long entries = static_cast<long long>(a.num_tokens) * k;
  if (self_ok)
    for (long long i = threadIdx.x; i < entries; i += blockDim.x) {
      const std::int64_t e =
          sent[wire::ll::combine_row(s, static_cast<int>(i / k), static_cast<int>(i % k))];
      if (e >= 0) atomicAdd(&expected[e / per_rank], 1);  // a lost rank's are never read
    }
  __syncthreads();
  for (int r = threadIdx.x; r < world; r += blockDim.x) {
    if (ll_lost_in(a, ll_part::combine, r, epoch)) continue;
    const ll_word c = classify_combine_word(words[r], epoch, self_ok, expected[r]);
    if (is_protocol_violation(c)) atomicMin(&first_violation, r);
    if (c == ll_word::rejected) atomicMin(&first_rejecting, r);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const ll_scan scan{first_violation == INT_MAX ? -1 : first_violation,
                       first_rejecting == INT_MAX ? -1 : first_rejecting};
    ll_report r{};
    combine_verdict(
        scan, words,
        reinterpret_cast<const wire::ll::reject_record*>(ll_region(a, rank, a.plan.rejects)), world,
        rank, epoch, self_ok, expected, r);
    if (r.code != ll_failure::none) ll_record(a.ws.rep, r, abort_link_of(a));
  }
  for (int r = threadIdx.x; r < world; r += blockDim.x) {
    a.ws.combine_wait_sum[r] += a.ws.wait_ns[world + r];
    a.ws.wait_ns[world + r] = 0;
  }
}

// Grid: ll_combine_recv_blocks; dynamic shared memory: max_topk row pointers
// and weights.
template <int Hidden>
__global__ void __launch_bounds__(ll_threads)
    ll_combine_recv_kernel(const __grid_constant__ ll_args a) {
  extern __shared__ __align__(16) std::byte smem[];
  __shared__ int accepted;
  const auto [rep, s, world, rank, p, warp, lane] = ll_thread_of(a);
  if (block_is_broken(rep)) return;
  const std::uint64_t epoch = a.ws.combine_epoch[p];
  const bool self_ok = a.ws.combine_ok[p] != 0;
  const auto* words =
      reinterpret_cast<const wire::ll::count_word*>(ll_region(a, rank, a.plan.combine_counts));

  bool ok = true;
  if (warp == 0) {
    bool fine = true;
    for (int r = lane; r < world && ok; r += warp_size) {
      std::uint64_t waited = 0;
      const ll_peer got =
          ll_wait_peer(a, ll_part::combine, ll_signal(a, rank, wire::ll::combine_signal(s, p, r)),
                       epoch, r, ll_op::combine, ll_waited_for::combined_rows, &waited);
      ok = got != ll_peer::failed;
      if (!ok) break;
      atomicMax(reinterpret_cast<unsigned long long*>(a.ws.wait_ns + world + r),
                static_cast<unsigned long long>(waited));
      if (got == ll_peer::lost) continue;  // reduce skips its rows
      // Rows are counted by the last block; here only whether to reduce.
      if (classify_combine_word(words[r], epoch, false, 0) != ll_word::ok) fine = false;
    }
    fine = __all_sync(0xffffffffu, fine);
    if (lane == 0) accepted = self_ok && fine;
  }
  if (__syncthreads_and(ok ? 1 : 0) == 0) return;

  if (accepted) {
    auto** rows = reinterpret_cast<const std::byte**>(smem);
    auto* w = reinterpret_cast<float*>(rows + s.max_topk);
    for (int t = blockIdx.x; t < a.num_tokens; t += gridDim.x)
      reduce_ll_token<Hidden>(a, t, rows, w);
  }

  const int kernel = static_cast<int>(ll_kernel::combine_recv);
  if (!ll_last_block(a.ws.blocks_done + kernel * wire::ll::parities + p)) return;
  finish_combine(a, epoch, self_ok);
}

}  // namespace epcomm::cuda::device
