#include "core/reader_config.h"

namespace fastpipe {
namespace {

template <typename T>
void check_int(const char* name, T value, T init, T low, T high, const char* why) {
  if (value == init && has_automatic(init, low, high)) return;  // automatic
  if (value < low || value > high)
    throw Error(ErrorKind::kValue, out_of_range_message(name, value < low, std::to_string(value < low ? low : high),
                                                        why, std::to_string(value)));
}

}  // namespace

std::string out_of_range_message(const char* name, bool below, const std::string& bound, const char* why,
                                 const std::string& value) {
  return std::string(name) + (below ? " must be at least " : " must be at most ") + bound + (below ? "" : why) +
         ", got " + value;
}

void ReaderConfig::check() const {
#define FASTPIPE_CHECK_INT(type, name, init, low, high, why) \
  check_int<type>(#name, name, static_cast<type>(init), static_cast<type>(low), static_cast<type>(high), why);
#define FASTPIPE_CHOICE_IS_TYPED(type, name, init)
  FASTPIPE_READER_CONFIG(FASTPIPE_CHECK_INT, FASTPIPE_CHOICE_IS_TYPED)
#undef FASTPIPE_CHECK_INT
#undef FASTPIPE_CHOICE_IS_TYPED
}

}  // namespace fastpipe
