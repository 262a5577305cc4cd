// One integer field of a JSON object: a WebDataset sample's label kept in its .json member
// (fastpipe.WebDataset(label="json", label_field=...)). The document is parsed as Python's json.loads
// parses it (NaN and Infinity accepted, control characters in strings refused, the last of duplicate keys
// wins), without building it: only the field's value is kept. Fuzzed through tests/fuzz/tar_fuzz.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fastpipe {

// "" and *value: the integer of the top-level field `field` of the JSON object in data[0, size); or why
// not, as a phrase that follows the document's name ("is not valid JSON: ...", "is not a JSON object",
// "has no field 'x'", "has field 'x' = 2.5: a label must be a non-negative integer", "... out of range").
std::string json_integer_field(const char* data, size_t size, const std::string& field, int64_t* value);

}  // namespace fastpipe
