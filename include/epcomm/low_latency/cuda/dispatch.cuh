// Low-latency dispatch on the device, in the host engine's wire format
// (low_latency/wire.hpp), as two kernels a framework can launch apart to
// overlap compute with communication:
//
//   send     one block per token (contiguous chunks when tokens outnumber
//            blocks). Every block first waits until each receiver released
//            this parity's previous dispatch, and reads the whole routing:
//            an invalid expert id anywhere rejects the call before any record
//            moves, and the per-expert counts of earlier tokens give the
//            block its first slot in every region, so slots follow the host
//            engine's order (token, then top-k slot) without atomics. Per
//            token the block stages the record body once in shared memory
//            (bf16 copy, or the fp8 cast of core/fp8_scaling.hpp with one scale per
//            128 channels) and stores it, with its header, into slot i of
//            region (local expert, this rank) at every destination. The last
//            block writes the count words, each followed by its signal add
//            (release), or, for a rejected call, the reject records and
//            "rejected" count words. Over an RMA transport (low_latency/route.hpp)
//            records for other ranks are staged in this rank's buffer and the
//            last block's thread 0 hands them, and the count words, to the
//            proxy.
//   receive  one block per (local expert, source) region: wait for the
//            region's signal and those of earlier sources (whose counts give
//            the packed offset), check the count words, and unpack the
//            records into recv_x / recv_x_scales / recv_src / recv_range /
//            recv_count. The last block judges the call (dispatch_verdict),
//            updates the stats, and releases the parity to every source.
//
// With mask_lost_ranks a rank that exited gets nothing and, once the kernels
// find it gone, adds nothing: lost_peers.cuh.
#pragma once

#include <climits>
#include <cstring>
#include <type_traits>

#include "epcomm/core/fp8_scaling.hpp"
#include "epcomm/low_latency/cuda/kernel_parts.cuh"

namespace epcomm::cuda::device {

// Eight channels from `p`: one 16-byte load when aligned, else element-wise.
__device__ __forceinline__ void load8(const bf16* p, bool aligned, bf16 (&out)[8]) {
  if (aligned) {
    const int4 v = *reinterpret_cast<const int4*>(p);
    std::memcpy(out, &v, sizeof v);
  } else {
    for (int i = 0; i < 8; ++i) out[i] = p[i];
  }
}

// Stages token t's record body in shared memory: the payload (bf16 as is, or
// the fp8 cast), the fp8 scales, and zero padding up to a 16-byte multiple.
template <class Wire, int Hidden>
__device__ void stage_body(const ll_args& a, int t, std::byte* body) {
  const int hidden = ll_hidden(a, Hidden);
  const bf16* row = a.x + static_cast<std::size_t>(t) * hidden;
  std::size_t used = 0;
  if constexpr (std::is_same_v<Wire, bf16>) {
    used = static_cast<std::size_t>(hidden) * sizeof(bf16);
    if constexpr (Hidden > 0)
      group_copy<static_cast<std::size_t>(Hidden) * sizeof(bf16), ll_threads>(
          body, reinterpret_cast<const std::byte*>(row), threadIdx.x);
    else
      group_copy(body, reinterpret_cast<const std::byte*>(row), used, threadIdx.x, blockDim.x);
  } else {
    // Each thread casts 8 channels; the 16 threads of a half-warp hold one
    // 128-channel block, whose amax they merge with shuffles. hidden is a
    // multiple of 128, so a half-warp is entirely in or out of the row.
    const int vectors = hidden / 8;
    const int lane = threadIdx.x % warp_size;
    const bool aligned = Hidden > 0 || (reinterpret_cast<std::uintptr_t>(row) & 15u) == 0;
    auto* q = reinterpret_cast<fp8_e4m3*>(body);
    auto* scales = reinterpret_cast<float*>(body + hidden);
    const bool pow2 = a.round_scale != 0;
    for (int base = static_cast<int>(threadIdx.x) - lane; base < vectors; base += ll_threads) {
      const int v = base + lane;
      bf16 e[8] = {};
      if (v < vectors) load8(row + static_cast<std::size_t>(v) * 8, aligned, e);
      float amax = fp8_partial_amax(e, 8);
#pragma unroll
      for (int m = 8; m >= 1; m >>= 1)
        amax = fp8_amax_merge(amax, __shfl_xor_sync(0xffffffffu, amax, m));
      if (v < vectors) {
        const float inv = fp8_block_inv_scale(amax, pow2);
        fp8_e4m3 out[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = quantize_fp8(to_float(e[i]), inv);
        int2 packed;
        std::memcpy(&packed, out, sizeof packed);
        *reinterpret_cast<int2*>(q + static_cast<std::size_t>(v) * 8) = packed;
        if ((lane & 15) == 0) scales[v / 16] = fp8_block_scale(amax, pow2);
      }
    }
    used = static_cast<std::size_t>(hidden) + sizeof(float) * (hidden / fp8_block);
  }
  const std::size_t pad = ll_body_bytes(a.shape) - used;
  if (threadIdx.x < pad) body[used + threadIdx.x] = std::byte{0};
}

// Warp 0: the slot of each (t, j) in its region, in the host engine's order
// (the running per-expert counts `next` start at the block's first token),
// the header at every destination record (none on a rank that exited), and
// what this rank dispatched.
__device__ inline void aim_token(const ll_args& a, int t, int* next, std::byte** dest,
                                 const ll_gone& gone) {
  const wire::ll::shape& s = a.shape;
  const int lane = threadIdx.x % warp_size;
  const int k = a.topk;
  const int rank = a.peers.rank;
  const int per_rank = s.local_experts();
  auto* sent = reinterpret_cast<std::int64_t*>(ll_region(a, rank, a.plan.sent_topk_idx));
  for (int j0 = 0; j0 < k; j0 += warp_size) {
    const int j = j0 + lane;
    const std::int64_t e = j < k ? a.topk_idx[static_cast<std::size_t>(t) * k + j] : -1;
    // A token may name an expert twice: lanes with the same id take
    // consecutive slots, in top-k order.
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const bool routed = j < k && e >= 0;
    const int before = __popc(same & ((1u << lane) - 1u));
    const int slot = routed ? next[e] + before : 0;
    __syncwarp();
    if (routed && before == 0) next[e] += __popc(same);
    __syncwarp();
    if (j >= k) continue;
    sent[wire::ll::combine_row(s, t, j)] = e;
    std::byte* rec = nullptr;
    const int dst = routed ? static_cast<int>(e / per_rank) : 0;
    if (routed && !gone.skipped[dst]) {  // a lost rank's records are not sent
      const int le = static_cast<int>(e % per_rank);
      // Over RMA a record for another rank is staged by destination expert.
      rec = a.route.via_proxy != 0 && dst != rank
                ? ll_own_buffer(a) +
                      wire::ll::staged_record(s, a.plan, a.parity, static_cast<int>(e), slot)
                : ll_region(a, dst, a.plan.dispatch_recv) +
                      wire::ll::record_offset(s, a.plan, le, rank, slot);
      *reinterpret_cast<int4*>(rec) = make_int4(rank, t, j, 0);  // record_header{{rank, t, j}, 0}
    }
    dest[j] = rec;
  }
}

// The block stores the staged body after the header of every destination
// record: each vector is read from shared memory once.
template <int Hidden>
__device__ void send_body(const ll_args& a, const std::byte* body, std::byte* const* dest) {
  const int k = a.topk;
  const int words = static_cast<int>(ll_body_bytes(a.shape) / 16);
  const auto* in = reinterpret_cast<const int4*>(body);
  constexpr std::size_t header = sizeof(wire::ll::record_header);
  for (int w = threadIdx.x; w < words; w += ll_threads) {
    const int4 v = in[w];
    for (int j = 0; j < k; ++j)
      if (dest[j] != nullptr) reinterpret_cast<int4*>(dest[j] + header)[w] = v;
  }
}

template <class Wire, int Hidden>
__global__ void __launch_bounds__(ll_threads)
    ll_dispatch_send_kernel(const __grid_constant__ ll_args a) {
  extern __shared__ __align__(16) std::byte smem[];
  __shared__ unsigned long long first_bad;  // lowest invalid topk_idx entry
  __shared__ int first_overflow;            // lowest expert named more often than it has slots
  __shared__ ll_gone gone;
  const auto [rep, s, world, rank, p, warp, lane] = ll_thread_of(a);
  if (block_is_broken(rep)) return;
  const int experts = s.num_experts;
  const int k = a.topk;
  const std::uint64_t epoch = a.ws.dispatch_epoch[p] + 1;
  std::byte* body = smem;
  auto** dest = reinterpret_cast<std::byte**>(smem + ll_body_bytes(s));
  int* next = reinterpret_cast<int*>(dest + s.max_topk);  // [E] entries before the current token
  int* total = next + experts;                            // [E] entries of the whole call
  const token_range mine = token_chunk(a.num_tokens, gridDim.x, blockIdx.x);

  for (int e = threadIdx.x; e < experts; e += blockDim.x) next[e] = total[e] = 0;
  if (threadIdx.x == 0) {
    first_bad = ULLONG_MAX;
    first_overflow = INT_MAX;
  }
  __syncthreads();

  bool ok = true;
  if (epoch > 1 && warp == 0)
    for (int r = lane; r < world && ok; r += warp_size) {
      bool skipped = false;  // a lost rank releases nothing, and reads nothing more
      ok = ll_wait(ll_signal(a, rank, wire::ll::released_signal(s, p, r)), epoch - 1, a.timeout_ns,
                   rep, abort_link_of(a), ll_op::dispatch, r, ll_waited_for::release,
                   [&] {
                     if (!ll_peer_gone(a, r, ll_op::dispatch, ll_waited_for::release)) return false;
                     skipped = ll_masking(a);
                     return true;
                   }) ||
           skipped;
    }
  // Over RMA, every put that read this parity's staging (its previous
  // dispatch and combine) must be complete before any block writes it again.
  if (a.route.via_proxy != 0 && threadIdx.x == 0 && ok)
    ok = ll_channel_ok(rep, abort_link_of(a), ll_op::dispatch, a.route.parity[p].quiet());

  // The whole routing, read by every block: whether the call is valid must be
  // known before any record moves, and the counts of earlier tokens place
  // this block's records.
  const long long entries = static_cast<long long>(a.num_tokens) * k;
  const long long before_mine = static_cast<long long>(mine.first) * k;
  for (long long i = threadIdx.x; i < entries; i += blockDim.x) {
    const std::int64_t e = a.topk_idx[i];
    if (e < -1 || e >= experts) {
      atomicMin(&first_bad, static_cast<unsigned long long>(i));
    } else if (e >= 0) {
      atomicAdd(&total[e], 1);
      if (i < before_mine) atomicAdd(&next[e], 1);
    }
  }
  if (__syncthreads_and(ok ? 1 : 0) == 0) return;
  ll_look_for_exits(a, gone);
  // A region has max_tokens_per_rank slots; only tokens naming an expert twice
  // can overflow it, and an overflowing call is rejected like a bad id.
  for (int e = threadIdx.x; e < experts; e += blockDim.x)
    if (total[e] > s.max_tokens_per_rank) atomicMin(&first_overflow, e);
  __syncthreads();
  const bool valid =
      a.host_cause[0] == '\0' && first_bad == ULLONG_MAX && first_overflow == INT_MAX;

  if (valid) {
    for (int t = mine.first; t < mine.last; ++t) {
      stage_body<Wire, Hidden>(a, t, body);
      if (warp == 0) aim_token(a, t, next, dest, gone);
      __syncthreads();
      send_body<Hidden>(a, body, dest);
      __syncthreads();  // body and dest are reused by the next token
    }
  }

  const int kernel = static_cast<int>(ll_kernel::dispatch_send);
  if (!ll_last_block(a.ws.blocks_done + kernel * wire::ll::parities + p)) return;
  if (!valid)
    post_reject_records(a, wire::ll::reject_kind::dispatch, epoch, [&](char* cause) {
      if (a.host_cause[0] != '\0')
        copy_cause(cause, a.host_cause);
      else if (first_bad != ULLONG_MAX)
        describe_invalid_expert(cause, wire::cause_bytes, static_cast<long long>(first_bad), k,
                                a.topk_idx[first_bad], experts);
      else
        describe_expert_overflow(cause, wire::cause_bytes, first_overflow,
                                 a.shape.max_tokens_per_rank);
    });
  const int per_rank = s.local_experts();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    const int dst = e / per_rank;
    const int le = e % per_rank;
    if (gone.skipped[dst]) continue;
    const wire::ll::count_word w{epoch, valid ? total[e] : 0,
                                 valid ? wire::ll::state::ok : wire::ll::state::rejected,
                                 token_traits<Wire>::id};
    if (a.route.via_proxy != 0)
      *reinterpret_cast<wire::ll::count_word*>(
          ll_own_buffer(a) + wire::ll::dispatch_count_write(s, a.plan, p, rank, e).local) = w;
    else
      publish_count(ll_region(a, dst, a.plan.dispatch_counts) +
                        (static_cast<std::size_t>(le) * world + rank) * sizeof w,
                    ll_signal(a, dst, wire::ll::dispatch_signal(s, p, le, rank)), w);
  }
  if (a.route.via_proxy != 0) {
    // What the proxy reads: written by every thread, published before the
    // descriptors that name it.
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0)
      ll_channel_ok(
          rep, abort_link_of(a), ll_op::dispatch,
          ll_push::dispatch(a.route.parity[p].writer(), s, a.plan, p, rank, total, !valid));
  }
  if (threadIdx.x == 0) {
    a.ws.dispatch_epoch[p] = epoch;
    a.ws.dispatch_ok[p] = valid ? 1 : 0;
  }
}

// Warp: validates record i of region (le, src) and unpacks it into packed row
// `row` of local expert le.
template <class Wire, int Hidden>
__device__ void unpack_record(const ll_args& a, int le, int src, int i, int row) {
  const wire::ll::shape& s = a.shape;
  const int rank = a.peers.rank;
  const int lane = threadIdx.x % warp_size;
  const int hidden = ll_hidden(a, Hidden);
  const std::byte* rec =
      ll_region(a, rank, a.plan.dispatch_recv) + wire::ll::record_offset(s, a.plan, le, src, i);
  const int4 h = *reinterpret_cast<const int4*>(rec);
  const wire::ll::source from{h.x, h.y, h.z};
  // Combine writes into the source's buffer at (token, top-k slot): a header
  // out of range must never get that far.
  if (from.rank != src || from.token < 0 || from.token >= s.max_tokens_per_rank ||
      from.topk_slot < 0 || from.topk_slot >= s.max_topk) {
    if (lane == 0) {
      ll_report r{};
      r.code = ll_failure::record_source;
      r.op = ll_op::dispatch;
      r.peer = src;
      r.index = i;
      r.src_rank = from.rank;
      r.src_token = from.token;
      r.src_slot = from.topk_slot;
      ll_record(a.ws.rep, r, abort_link_of(a));
    }
    return;
  }
  const std::size_t packed = static_cast<std::size_t>(le) * s.rows_per_expert() + row;
  const std::size_t payload = static_cast<std::size_t>(hidden) * sizeof(Wire);
  std::byte* x = ll_region(a, rank, a.plan.recv_x) + packed * payload;
  const std::byte* body = rec + sizeof(wire::ll::record_header);
  if constexpr (Hidden > 0)
    group_copy<static_cast<std::size_t>(Hidden) * sizeof(Wire), warp_size>(x, body, lane);
  else
    group_copy(x, body, payload, lane, warp_size);
  if constexpr (token_traits<Wire>::has_scales)
    wire::ll::store_scales(s, ll_region(a, rank, a.plan.recv_scales), le, row,
                           rec + wire::ll::scales_offset(s), lane, warp_size);
  if (lane == 0)
    reinterpret_cast<wire::ll::source*>(ll_region(a, rank, a.plan.recv_src))[packed] = from;
}

// Lane: waits for source `from`'s count word of region (le, from) of
// dispatch `epoch`; with mask_lost_ranks, for those of all its regions, so
// that the source arrives whole or is lost whole (lost_peers.cuh).
__device__ inline ll_peer wait_source(const ll_args& a, int le, int from, std::uint64_t epoch,
                                      std::uint64_t* waited_ns) {
  const int el = a.shape.local_experts();
  const int regions = ll_masking(a) ? el : 1;
  for (int i = 0; i < regions; ++i) {
    const int region = (le + i) % el;  // its own region first: that wait is the one timed
    const ll_peer got = ll_wait_or_lost(
        a, ll_part::dispatch,
        ll_signal(a, a.peers.rank, wire::ll::dispatch_signal(a.shape, a.parity, region, from)),
        epoch, from, ll_op::dispatch, ll_waited_for::dispatch_records,
        i == 0 ? waited_ns : nullptr);
    if (got != ll_peer::arrived) return got;
  }
  return ll_masking(a) ? ll_settle(a, ll_part::dispatch, from, epoch, ll_peer::arrived)
                       : ll_peer::arrived;
}

// The last receive block, once every region was read: judges the call from
// every count word (classified in parallel, in the host engine's order) and
// records the verdict; updates the stats.
template <class Wire>
__device__ void finish_dispatch(const ll_args& a, std::uint64_t epoch, bool self_ok) {
  __shared__ int first_violation, first_rejecting, first_other_wire, accepted;
  const wire::ll::shape& s = a.shape;
  const int world = s.world_size;
  const int el = s.local_experts();
  const int rank = a.peers.rank;
  const auto* words =
      reinterpret_cast<const wire::ll::count_word*>(ll_region(a, rank, a.plan.dispatch_counts));
  if (threadIdx.x == 0) first_violation = first_rejecting = first_other_wire = INT_MAX;
  __syncthreads();
  for (int i = threadIdx.x; i < el * world; i += blockDim.x) {
    const int src = i / el;  // i = src * el + le: the host engine's order
    const int le = i % el;
    if (ll_lost_in(a, ll_part::dispatch, src, epoch)) continue;  // its words are not read
    const ll_word c = classify_dispatch_word(words[le * world + src], epoch, s.max_tokens_per_rank,
                                             token_traits<Wire>::id);
    if (is_protocol_violation(c)) atomicMin(&first_violation, i);
    if (c == ll_word::rejected) atomicMin(&first_rejecting, src);
    if (c == ll_word::wrong_wire) atomicMin(&first_other_wire, i);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const auto found = [](int v) { return v == INT_MAX ? -1 : v; };
    const ll_scan scan{found(first_violation), found(first_rejecting), found(first_other_wire)};
    ll_report r{};
    dispatch_verdict(
        scan, words,
        reinterpret_cast<const wire::ll::reject_record*>(ll_region(a, rank, a.plan.rejects)), el,
        world, rank, epoch, s.max_tokens_per_rank, token_traits<Wire>::id, self_ok, r);
    accepted = r.code == ll_failure::none ? 1 : 0;
    if (!accepted) {
      ll_record(a.ws.rep, r, abort_link_of(a));
      a.ws.dispatch_ok[a.parity] = 0;  // no combine may answer this dispatch
    }
  }
  __syncthreads();
  const auto* recv_count =
      reinterpret_cast<const std::int32_t*>(ll_region(a, rank, a.plan.recv_count));
  if (accepted)
    for (int le = threadIdx.x; le < el; le += blockDim.x)
      a.ws.recv_tokens[le] += static_cast<std::uint64_t>(recv_count[le]);
  for (int r = threadIdx.x; r < world; r += blockDim.x) {
    a.ws.dispatch_wait_sum[r] += a.ws.wait_ns[r];
    a.ws.wait_ns[r] = 0;
  }
}

template <class Wire, int Hidden>
__global__ void __launch_bounds__(ll_threads)
    ll_dispatch_recv_kernel(const __grid_constant__ ll_args a) {
  __shared__ int begin, count, unpack;
  const auto [rep, s, world, rank, p, warp, lane] = ll_thread_of(a);
  if (block_is_broken(rep)) return;
  const std::uint64_t epoch = a.ws.dispatch_epoch[p];
  const bool self_ok = a.ws.dispatch_ok[p] != 0;
  const auto* words =
      reinterpret_cast<const wire::ll::count_word*>(ll_region(a, rank, a.plan.dispatch_counts));

  // One (local expert, source) region at a time; a budget below
  // E_local * R blocks takes turns.
  for (int region = blockIdx.x; region < s.local_experts() * world; region += gridDim.x) {
    const int le = region / world;
    const int src = region % world;
    // Warp 0 waits for this region and every earlier source's region of the
    // same expert: their counts place this one's rows.
    bool ok = true;
    if (warp == 0) {
      int rows_before = 0, n = 0;
      bool rejected = false, violated = false;
      for (int from = lane; from <= src && ok; from += warp_size) {
        std::uint64_t waited = 0;
        const ll_peer got = wait_source(a, le, from, epoch, &waited);
        ok = got != ll_peer::failed;
        if (!ok) break;
        if (from == src)
          atomicMax(reinterpret_cast<unsigned long long*>(a.ws.wait_ns + src),
                    static_cast<unsigned long long>(waited));
        if (got == ll_peer::lost) continue;  // nothing of its is read: it adds no rows
        const wire::ll::count_word w = words[le * world + from];
        const ll_word c =
            classify_dispatch_word(w, epoch, s.max_tokens_per_rank, token_traits<Wire>::id);
        if (c == ll_word::rejected)
          rejected = true;
        else if (c != ll_word::ok)
          violated = true;
        else if (from < src)
          rows_before += w.count;
        else
          n = w.count;
      }
      rows_before = __reduce_add_sync(0xffffffffu, rows_before);
      n = __reduce_add_sync(0xffffffffu, n);
      rejected = __any_sync(0xffffffffu, rejected);
      violated = __any_sync(0xffffffffu, violated);
      if (lane == 0) {
        begin = rows_before;
        count = n;
        // A failing call only drains, as the host engine does; the verdict
        // comes from the last block.
        unpack = self_ok && !rejected && !violated;
      }
    }
    if (__syncthreads_and(ok ? 1 : 0) == 0) return;

    if (unpack) {
      if (threadIdx.x == 0) {
        reinterpret_cast<wire::ll::range*>(
            ll_region(a, rank, a.plan.recv_range))[static_cast<std::size_t>(le) * world + src] = {
            begin, count};
        if (src == world - 1)
          reinterpret_cast<std::int32_t*>(ll_region(a, rank, a.plan.recv_count))[le] =
              begin + count;
      }
      for (int i = warp; i < count; i += ll_warps)
        unpack_record<Wire, Hidden>(a, le, src, i, begin + i);
    }
    __syncthreads();  // begin, count and unpack belong to this region until here
  }

  const int kernel = static_cast<int>(ll_kernel::dispatch_recv);
  if (!ll_last_block(a.ws.blocks_done + kernel * wire::ll::parities + p)) return;
  // The verdict reads count words and reject records: before the release,
  // after which a source may write this parity's regions again.
  finish_dispatch<Wire>(a, epoch, self_ok);
  __syncthreads();
  if (a.route.via_proxy != 0) {
    if (threadIdx.x == 0)
      ll_channel_ok(rep, abort_link_of(a), ll_op::dispatch,
                    ll_push::release(a.route.parity[p].writer(), s, p, rank));
    return;
  }
  for (int r = threadIdx.x; r < world; r += blockDim.x)
    if (!ll_skipped(a, r)) add_release(ll_signal(a, r, wire::ll::released_signal(s, p, rank)), 1);
}

}  // namespace epcomm::cuda::device
