// The fallback decoder of image columns (core/image_fallback.h) as a Python callable: Pillow, from
// fastpipe/data/_pillow.py.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "core/image_fallback.h"

namespace fastpipe {

// `decode(bytes) -> uint8 array (height, width, 3)`, called from reader threads with the GIL held for
// that call only.
std::shared_ptr<const FallbackDecoder> python_fallback_decoder(pybind11::object decode);

}  // namespace fastpipe
