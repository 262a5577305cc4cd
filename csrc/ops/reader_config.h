// The reader's settings and counters to and from Python: fastpipe._C.ReaderConfig, generated from
// FASTPIPE_READER_CONFIG, and the stats dicts, generated from FASTPIPE_READER_STATS / _DEVICE_STATS.
#pragma once

#include <pybind11/pybind11.h>

#include "core/batch_reader.h"
#include "core/device_pipeline.h"

namespace fastpipe {

// _C.ReaderConfig, READER_STATS, DEVICE_STATS, and the automatic settings' policies (for tests).
void bind_reader_config(pybind11::module& m);

// A Choices<E> table's names as a Python tuple: the options Python lists and checks against.
template <typename E>
pybind11::tuple choice_names() {
  pybind11::list names;
  for (const auto& e : Choices<E>::names) names.append(e.name);
  return pybind11::tuple(names);
}
// The engine's errors as Python exceptions, the dtype table, the .npy header reader (engine_tables.cpp).
void bind_engine_tables(pybind11::module& m);
pybind11::dict stats_dict(const ReaderStats& reader, const DeviceStats* device);

}  // namespace fastpipe
