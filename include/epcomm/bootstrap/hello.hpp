// The first message of env_bootstrap's rendezvous: a member tells rank 0 which job it belongs to,
// the world size it was started with and its rank. Rank 0 parses it as it arrives, from bytes a
// stranger on the port may have sent, so the parse is bounded (a hello is at most
// hello_header_bytes + max_job_id_bytes) and total (every input is incomplete, a hello, or a
// stranger, with the reason).
//
//   magic u32 ("EPB2"), world_size u32, rank u32, job id length u32, job id bytes
//
// Little-endian whatever the host, so that mixed clusters agree.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace epcomm::detail::tcp {

template <std::size_t N>
void put_le(std::byte* at, std::uint64_t v) {
  for (std::size_t i = 0; i < N; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}
template <std::size_t N>
std::uint64_t get_le(const std::byte* at) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < N; ++i) v |= std::to_integer<std::uint64_t>(at[i]) << (8 * i);
  return v;
}

// Starts the hello and every reply. Version 2 added the job id: a version-1 process is a
// stranger to this one, as it should be.
inline constexpr std::uint64_t magic = 0x32425045;  // "EPB2"
inline constexpr std::size_t hello_header_bytes = 16;
inline constexpr std::size_t max_job_id_bytes = 256;
inline constexpr std::size_t max_hello_bytes = hello_header_bytes + max_job_id_bytes;

struct hello {
  std::uint32_t world_size = 0;
  std::uint32_t rank = 0;
  std::string job_id;  // at most max_job_id_bytes
};

inline std::vector<std::byte> encode_hello(const hello& h) {
  const std::size_t n = std::min(h.job_id.size(), max_job_id_bytes);
  std::vector<std::byte> out(hello_header_bytes + n);
  put_le<4>(&out[0], magic);
  put_le<4>(&out[4], h.world_size);
  put_le<4>(&out[8], h.rank);
  put_le<4>(&out[12], n);
  std::copy_n(reinterpret_cast<const std::byte*>(h.job_id.data()), n, out.begin() + 16);
  return out;
}

enum class hello_state { incomplete, complete, stranger };

struct hello_parse {
  hello_state state = hello_state::incomplete;
  std::size_t needed = hello_header_bytes;  // bytes this hello has in all, as far as known
  hello value;                              // complete only
  std::string why;                          // stranger only
};

// What the first got.size() bytes of a connection say. A reader asks for at most `needed - got`
// more bytes, so it never reads past the hello.
inline hello_parse parse_hello(std::span<const std::byte> got) {
  hello_parse p;
  // The magic is checked as soon as any of it is there, so a stranger is dropped at its first
  // byte rather than held until it sends 16.
  std::array<std::byte, 4> want{};
  put_le<4>(want.data(), magic);
  if (!std::equal(got.begin(), got.begin() + std::min<std::size_t>(got.size(), 4), want.begin())) {
    p.state = hello_state::stranger;
    p.why = "not an epcomm bootstrap hello";
    return p;
  }
  if (got.size() < hello_header_bytes) return p;
  const std::uint64_t length = get_le<4>(&got[12]);
  if (length > max_job_id_bytes) {
    p.state = hello_state::stranger;
    p.why = "a job id of " + std::to_string(length) + " bytes, more than " +
            std::to_string(max_job_id_bytes);
    return p;
  }
  p.needed = hello_header_bytes + static_cast<std::size_t>(length);
  if (got.size() < p.needed) return p;
  p.state = hello_state::complete;
  p.value.world_size = static_cast<std::uint32_t>(get_le<4>(&got[4]));
  p.value.rank = static_cast<std::uint32_t>(get_le<4>(&got[8]));
  p.value.job_id.assign(reinterpret_cast<const char*>(got.data() + hello_header_bytes),
                        static_cast<std::size_t>(length));
  return p;
}

}  // namespace epcomm::detail::tcp
