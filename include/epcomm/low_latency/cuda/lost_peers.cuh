// A peer's exit in the low-latency kernels. The host's exit watch
// (cuda/exit_watch.hpp) sets a peer's word once its process is gone; kernels
// read it where they already spin. Without mask_lost_ranks a wait for a peer
// that exited fails at once, naming it, as over the host transports. With it,
// the host engine's rule (host/lost_ranks.hpp, low_latency/buffer.hpp): the
// wait ends as lost, the call goes on without the peer, and so does every
// later call; a peer that is only slow still fails at the deadline. Kernels
// wait in many blocks at once, so whether a peer's part of a call arrived or
// is lost is decided once, by the first block of this rank to find out, for
// every block: all of them then pack, check and reduce the same peers. A
// source's dispatch counts as arrived only when every one of its regions has
// (the host engine waits for a source's regions together): nothing of a lost
// source is read, even records that landed.
#pragma once

#include <cstdint>

#include "epcomm/low_latency/cuda/launch.hpp"
#include "epcomm/low_latency/cuda/sync.cuh"

namespace epcomm::cuda::device {

enum class ll_peer : int { failed = 0, arrived, lost };

// Which call's parts a decision word is about.
enum class ll_part : int { dispatch = 0, combine = 1 };

__device__ __forceinline__ bool ll_masking(const ll_args& a) { return a.mask_lost_ranks != 0; }

// Host memory, far from the device: read it where a wait already spins, or
// once per block (ll_gone).
__device__ __forceinline__ bool ll_exited(const ll_args& a, int r) {
  return a.ws.exited != nullptr && load_acquire(a.ws.exited + r) != 0;
}

// Whether this rank goes on without rank r: it is masking and r exited.
__device__ __forceinline__ bool ll_skipped(const ll_args& a, int r) {
  return ll_masking(a) && ll_exited(a, r);
}

// A wait's gave_up for peer r: false while r lives; once it exited, true,
// and without mask_lost_ranks recorded as the call's failure.
__device__ inline bool ll_peer_gone(const ll_args& a, int r, ll_op op, ll_waited_for what) {
  if (!ll_exited(a, r)) return false;
  if (!ll_masking(a)) {
    ll_report rep{};
    rep.code = ll_failure::peer_exited;
    rep.peer = r;
    rep.what = what;
    rep.op = op;
    ll_record(a.ws.rep, rep, abort_link_of(a));
  }
  return true;
}

__device__ __forceinline__ unsigned long long* ll_decision(const ll_args& a, ll_part k, int r) {
  const int at = (static_cast<int>(k) * wire::ll::parities + a.parity) * a.shape.world_size + r;
  return reinterpret_cast<unsigned long long*>(a.ws.peer_state + at);
}

// Decides that peer r's part of call `epoch` is `seen` (arrived or lost)
// unless a block of this rank decided first; returns the decision.
__device__ inline ll_peer ll_settle(const ll_args& a, ll_part k, int r, std::uint64_t epoch,
                                    ll_peer seen) {
  unsigned long long* word = ll_decision(a, k, r);
  const unsigned long long mine = 2 * epoch + (seen == ll_peer::lost ? 1 : 0);
  unsigned long long now = atomicCAS(word, 0ull, 0ull);  // an atomic read
  while (now < 2 * epoch) {
    const unsigned long long was = atomicCAS(word, now, mine);
    now = was == now ? mine : was;
  }
  if ((now & 1u) == 0) return ll_peer::arrived;
  a.ws.lost[r] = 1;  // for lost_ranks()
  return ll_peer::lost;
}

// Whether peer r was decided lost in call `epoch` (every wait for it is over).
__device__ __forceinline__ bool ll_lost_in(const ll_args& a, ll_part k, int r,
                                           std::uint64_t epoch) {
  return ll_masking(a) && atomicCAS(ll_decision(a, k, r), 0ull, 0ull) == 2 * epoch + 1;
}

// Waits for peer r's counter to reach `epoch`, as ll_wait; a peer that
// exited fails it or, with mask_lost_ranks, ends it as lost unless a block
// of this rank already decided its part arrived (then the counter will get
// there). Arrival is not decided here.
__device__ inline ll_peer ll_wait_or_lost(const ll_args& a, ll_part k, const std::uint64_t* counter,
                                          std::uint64_t epoch, int r, ll_op op, ll_waited_for what,
                                          std::uint64_t* waited_ns = nullptr) {
  bool lost = false;
  const bool got = ll_wait(
      counter, epoch, a.timeout_ns, a.ws.rep, abort_link_of(a), op, r, what,
      [&] {
        if (!ll_peer_gone(a, r, op, what)) return false;
        return !ll_masking(a) || (lost = ll_settle(a, k, r, epoch, ll_peer::lost) == ll_peer::lost);
      },
      waited_ns);
  return got ? ll_peer::arrived : lost ? ll_peer::lost : ll_peer::failed;
}

// The same for a part made of one counter: its arrival is decided too.
__device__ inline ll_peer ll_wait_peer(const ll_args& a, ll_part k, const std::uint64_t* counter,
                                       std::uint64_t epoch, int r, ll_op op, ll_waited_for what,
                                       std::uint64_t* waited_ns = nullptr) {
  const ll_peer got = ll_wait_or_lost(a, k, counter, epoch, r, op, what, waited_ns);
  return got == ll_peer::arrived && ll_masking(a) ? ll_settle(a, k, r, epoch, got) : got;
}

// With mask_lost_ranks, which peers had exited when a block looked, read
// once per block: sends skip them (each block may look at another time; what
// goes to a rank that exited is lost either way).
struct ll_gone {
  bool skipped[peer_table::max_ranks];
};

// Block-wide, with a barrier.
__device__ inline void ll_look_for_exits(const ll_args& a, ll_gone& gone) {
  for (int r = threadIdx.x; r < a.shape.world_size; r += blockDim.x)
    gone.skipped[r] = ll_skipped(a, r);
  __syncthreads();
}

}  // namespace epcomm::cuda::device
