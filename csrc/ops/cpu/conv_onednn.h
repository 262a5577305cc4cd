// The CPU engine "onednn": torch's oneDNN fused convolution + post-ops (what inductor uses on the CPU),
// declared only for the dtypes torch's oneDNN runs on this CPU.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace fastpipe::conv {

// The dtypes the oneDNN engine declares here, and the test hook that overrides them (None: this
// CPU's own answer); schemas in conv_act.cpp.
std::vector<std::string> onednn_dtype_names();
void onednn_dtypes_override_op(const std::optional<std::vector<std::string>>& dtypes);

}  // namespace fastpipe::conv
