// One of the two groups a rank of the hierarchical engine belongs to (its
// node, or its rail) together with the transport over that group, as the
// engine sees it:
//
//   - members are numbered within the group; world_rank() maps them back,
//     and errors the transport throws are re-thrown naming world ranks;
//   - bytes for a member are written where outgoing() says and handed over
//     with send(), as the host link does it (host/link.hpp): straight into
//     the member's buffer over a peer-mapped transport, staged and put
//     through the proxy over an RMA one;
//   - every byte handed over, stored into or read from another member is
//     counted, so that tests can prove what crossed which transport.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "epcomm/bootstrap/subgroup.hpp"
#include "epcomm/core/error.hpp"
#include "epcomm/host/link.hpp"
#include "epcomm/transport/concepts.hpp"

namespace epcomm {

// What one rank moved through one transport, per member of the group it
// sent to or read from. Payload is token rows and partial sums; control is
// notify records, statuses and masks. Transfers are the operations handed to
// the transport (one per array and destination block, never one per token)
// or, over a peer-mapped transport, the blocks stored.
struct group_traffic {
  std::vector<std::uint64_t> payload_bytes;
  std::vector<std::uint64_t> control_bytes;
  std::vector<std::uint64_t> transfers;

  explicit group_traffic(int members = 0)
      : payload_bytes(members, 0), control_bytes(members, 0), transfers(members, 0) {}
};

namespace detail {

enum class traffic_kind { payload, control };

template <class T>
requires peer_mapped_transport<T> || has_completion_count<T>
class group_link {
 public:
  static constexpr bool peer_mapped = !host_link<T>::via_proxy;

  // Collective over `parent`: the ranks passing the same `colour` bring up T
  // over their group. `members` are their world ranks in group order, as the
  // caller's topology says; `name` ("node 1", "rail 0") prefixes errors.
  template <bootstrap B>
  group_link(B& parent, int colour, std::string_view split, std::string name,
             std::vector<int> members, subgroup_locality locality, std::size_t bytes,
             std::size_t slots, deadline dl)
      : name_(std::move(name)),
        members_(std::move(members)),
        self_(static_cast<int>(std::find(members_.begin(), members_.end(), parent.rank()) -
                               members_.begin())),
        link_([&] { return connect(parent, colour, split, locality, members_, bytes, slots, dl); }),
        traffic_(size()) {}

  int size() const { return static_cast<int>(members_.size()); }
  int world_rank(int member) const { return members_[member]; }
  T& transport() { return link_.transport(); }
  const group_traffic& traffic() const { return traffic_; }

  std::byte* local(std::size_t offset) { return link_.local(offset); }

  // Member i's buffer at `offset`, for direct stores and loads.
  std::byte* peer(int i, std::size_t offset) requires peer_mapped { return link_.peer(i, offset); }

  // Where this rank writes the bytes member i will read at `remote`: i's
  // buffer itself, or the staging offset `staged` that send() puts from.
  std::byte* outgoing(int i, std::size_t remote, std::size_t staged) {
    return link_.outgoing(i, remote, staged);
  }

  // Hands over `bytes` written at outgoing(i, remote, staged).
  void send(int i, std::size_t staged, std::size_t remote, std::size_t bytes, traffic_kind kind,
            const deadline& dl) {
    count(i, bytes, kind);
    translated([&] { link_.put(producer_channel, i, staged, remote, bytes, dl); });
  }

  // send(), then adds 1 to member i's counter `slot` once those bytes and
  // every earlier write to i are visible there.
  void send_signal(int i, std::size_t staged, std::size_t remote, std::size_t bytes,
                   std::size_t slot, traffic_kind kind, const deadline& dl) {
    count(i, bytes, kind);
    translated([&] { link_.put_signal(producer_channel, i, staged, remote, bytes, slot, dl); });
  }

  // Adds 1 to member i's counter `slot` after every earlier write to i.
  void signal(int i, std::size_t slot, const deadline& dl) {
    translated([&] { link_.signal(producer_channel, i, slot, dl); });
  }

  // Over an RMA transport: returns once every put handed over is complete,
  // so the staging area may be written again.
  void quiet(const deadline& dl) {
    translated([&] { link_.quiet(producer_channel, dl); });
  }

  void wait(std::size_t slot, std::uint64_t expected, const deadline& dl, const char* op, int i,
            const char* what) {
    translated([&] { link_.transport().wait(slot, expected, dl, {op, i, what}); });
  }

  // Records bytes the engine stored into, or loaded from, member i's buffer
  // through peer().
  void count(int i, std::size_t bytes, traffic_kind kind) {
    if (i == self_) return;  // not traffic: this rank's own buffer
    (kind == traffic_kind::payload ? traffic_.payload_bytes : traffic_.control_bytes)[i] += bytes;
    ++traffic_.transfers[i];
  }

  // Gives up on the group where the transport can (peers waiting in it fail
  // at once); `culprit` is a world rank or no_peer.
  void abort(int culprit) {
    const auto at = std::find(members_.begin(), members_.end(), culprit);
    link_.abort(at == members_.end() ? no_peer : static_cast<int>(at - members_.begin()));
  }

 private:
  static constexpr int producer_channel = 0;  // the engine's calling thread

  template <bootstrap B>
  static T connect(B& parent, int colour, std::string_view split, subgroup_locality locality,
                   const std::vector<int>& members, std::size_t bytes, std::size_t slots,
                   deadline dl) {
    subgroup_bootstrap<B> group(parent, colour, split, dl, locality);
    if (!std::ranges::equal(group.members(), members))
      throw error(parent.rank(), "hierarchical buffer", no_peer,
                  "the bootstrap grouped ranks unlike the topology (nodes must be consecutive "
                  "ranks)");
    return T(group, bytes, slots, dl);
  }

  // Transports number peers within the group; the engine's errors name world
  // ranks, and say which group the transport served.
  template <class F>
  void translated(F&& f) {
    try {
      f();
    } catch (const error& e) {
      const bool member = e.peer() >= 0 && e.peer() < size();
      throw error(world_rank(self_), e.op(), member ? world_rank(e.peer()) : no_peer,
                  name_ + " transport (its ranks " + numbering() + "): " + e.cause());
    }
  }

  std::string numbering() const {
    std::string s;
    for (int i = 0; i < size(); ++i)
      s += (i == 0 ? "" : ", ") + std::to_string(i) + " = world " + std::to_string(members_[i]);
    return s;
  }

  std::string name_;
  std::vector<int> members_;
  int self_;
  host_link<T> link_;
  group_traffic traffic_;
};

}  // namespace detail
}  // namespace epcomm
