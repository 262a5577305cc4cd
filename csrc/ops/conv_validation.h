// Whether an engine computed a convolution as eager does: the tolerance for its dtype and device, and
// what differs (conv_tuner.cpp refuses an engine whose output disagrees).
#pragma once

#include <optional>
#include <string>

#include "ops/conv_tuner.h"

namespace fastpipe::conv {

// How far a candidate's output may be from eager's, relative to the largest magnitude of eager's.
double output_tolerance(const ConvArgs& a);

// Why every result of an engine (the output, or each gradient eager computed) is not eager's within
// tolerance; nullopt when all are.
std::optional<std::string> disagreement(const EngineOut& got, const EngineOut& want, const ConvArgs& a);

}  // namespace fastpipe::conv
