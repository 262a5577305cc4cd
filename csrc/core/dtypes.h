// The record dtypes fastpipe reads: one table for the .npy parser, the loader's tensors
// (csrc/ops/loader.cpp maps each id to a torch dtype) and Python (fastpipe._C.DTYPES).
#pragma once

#include <string>

namespace fastpipe {

enum class DtypeId { kBool, kUInt8, kInt8, kInt16, kUInt16, kInt32, kInt64, kFloat16, kFloat32, kFloat64 };

struct Dtype {
  DtypeId id;
  const char* name;      // numpy's name
  const char* npy_code;  // .npy descr without the byte order: kind + itemsize
  int itemsize;
};

inline constexpr Dtype kDtypes[] = {
    {DtypeId::kBool, "bool", "b1", 1},          {DtypeId::kUInt8, "uint8", "u1", 1},
    {DtypeId::kInt8, "int8", "i1", 1},          {DtypeId::kInt16, "int16", "i2", 2},
    {DtypeId::kUInt16, "uint16", "u2", 2},      {DtypeId::kInt32, "int32", "i4", 4},
    {DtypeId::kInt64, "int64", "i8", 8},        {DtypeId::kFloat16, "float16", "f2", 2},
    {DtypeId::kFloat32, "float32", "f4", 4},    {DtypeId::kFloat64, "float64", "f8", 8},
};

// The entry named `name` (numpy's name), or nullptr.
inline const Dtype* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

}  // namespace fastpipe
