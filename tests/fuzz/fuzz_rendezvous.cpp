// libFuzzer target over the rendezvous hello (bootstrap/hello.hpp), which rank 0 parses from
// whatever connects to its port. Fed in as rank 0 reads it, never asking for more than the parse
// says is needed, every input must end as incomplete, a stranger with a reason, or a hello that
// re-encodes to exactly the bytes it came from; a crash, a UB report or a trap is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "epcomm/bootstrap/hello.hpp"

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace epcomm::detail::tcp;
  const std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data), size);
  std::size_t got = 0;
  hello_parse p = parse_hello(input.first(0));
  while (p.state == hello_state::incomplete) {
    // Rank 0's reads are bounded by what the parse asks for, and that by max_hello_bytes.
    require(p.needed > got && p.needed <= max_hello_bytes);
    if (got == size) return 0;
    ++got;  // every prefix, as a connection that sends a byte at a time delivers it
    p = parse_hello(input.first(got));
  }
  if (p.state == hello_state::stranger) {
    require(!p.why.empty());
    return 0;
  }
  require(got == p.needed && p.value.job_id.size() <= max_job_id_bytes);
  const auto again = encode_hello(p.value);
  require(again.size() == got && std::equal(again.begin(), again.end(), input.begin()));
  return 0;
}
