// Settings a user names with a string (io="direct", on_error="replace"): each enum's names are written
// once, in its Choices<E> table, and serve parsing, printing and the Python API's list of options.
#pragma once

#include <cstddef>
#include <string>

#include "core/error.h"

namespace fastpipe {

template <typename E>
struct Named {
  E value;
  const char* name;
};

// Specialised per enum: `static constexpr Named<E> names[] = {...};`
template <typename E>
struct Choices;

template <typename E>
const char* choice_name(E value) {
  for (const auto& e : Choices<E>::names)
    if (e.value == value) return e.name;
  return "?";
}

// "'a', 'b', 'c'"
template <typename E>
std::string choice_list() {
  std::string known;
  for (const auto& e : Choices<E>::names) known += std::string(known.empty() ? "'" : ", '") + e.name + "'";
  return known;
}

// `arg` names the setting in the message: "io must be one of 'auto', 'mmap', ..., got 'fast'".
template <typename E>
E parse_choice(const char* arg, const std::string& name) {
  for (const auto& e : Choices<E>::names)
    if (name == e.name) return e.value;
  throw Error(ErrorKind::kValue, std::string(arg) + " must be one of " + choice_list<E>() + ", got '" + name + "'");
}

}  // namespace fastpipe
