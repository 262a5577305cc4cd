// The augmentations' parameters from Python (fastpipe/augment.py's stage dicts), checked, and the tables
// that module takes from C++ rather than copying: the op names, the stage kinds, the limits, the draw map.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <tuple>
#include <vector>

#include "kernels/augment_draws.h"

namespace fastpipe {

void set_augment(images::AugmentParams& a, const std::vector<pybind11::dict>& stages,
                 const std::vector<std::tuple<int, bool, float, int, int>>& candidates,
                 const std::vector<float>& magnitudes, const std::vector<int>& fill, const std::string& interpolation,
                 int blend, const std::vector<float>& fill_value, std::tuple<bool, bool, bool> rounding);

// _C.AUGMENT (ops, stage_kinds, limits) and _C.DRAW_RANGES.
void bind_augment_tables(pybind11::module& m);

}  // namespace fastpipe
