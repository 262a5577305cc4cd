// The reader's settings and counters to and from Python: fastpipe._C.ReaderConfig, generated from
// FASTPIPE_READER_CONFIG, and the stats dicts, generated from FASTPIPE_READER_STATS / _DEVICE_STATS.
#pragma once

#include <pybind11/pybind11.h>

#include "core/batch_reader.h"
#include "core/device_pipeline.h"

namespace fastpipe {

// _C.ReaderConfig, READER_STATS, DEVICE_STATS, and the automatic settings' policies (for tests).
void bind_reader_config(pybind11::module& m);
// The engine's errors as Python exceptions, the dtype table, the .npy header reader (engine_tables.cpp).
void bind_engine_tables(pybind11::module& m);
pybind11::dict stats_dict(const ReaderStats& reader, const DeviceStats* device);

}  // namespace fastpipe
