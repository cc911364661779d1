// The text of each enumerator of an enum whose values run 0, 1, ... N-1 in
// declaration order: one table per enum, read both ways (an enumerator's name
// for a message, a name back to its enumerator for a parser), where a switch
// per direction would say each name twice.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace epcomm {

template <class Enum, std::size_t N>
struct enum_names {
  std::array<const char*, N> text;  // text[i] names the enumerator of value i

  // `unknown` for a value outside the table (an integer cast unchecked, or
  // read from another process's memory).
  constexpr const char* operator()(Enum e, const char* unknown = "?") const {
    const auto i = static_cast<std::size_t>(e);
    return i < N ? text[i] : unknown;
  }

  constexpr std::optional<Enum> parse(std::string_view name) const {
    for (std::size_t i = 0; i < N; ++i)
      if (name == text[i]) return static_cast<Enum>(i);
    return std::nullopt;
  }
};

// names_for<E>("a", "b"): the table for an enum whose enumerators are, in
// order, the ones named; `last` (the final enumerator) makes a table that
// misses one fail to compile.
template <class Enum, Enum last, class... Text>
constexpr enum_names<Enum, sizeof...(Text)> names_for(Text... text) {
  static_assert(static_cast<std::size_t>(last) + 1 == sizeof...(Text),
                "one name per enumerator, in declaration order");
  return {{text...}};
}

}  // namespace epcomm
