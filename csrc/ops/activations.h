// The fused convolution's activations in ATen: parsing the ops' (activation, act_args) into an ActSpec
// (kernels/activation.h holds the table), applying one, and its backward.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <vector>

#include "kernels/activation.h"

namespace fastpipe::conv {

// ValueError for an unknown name (listing the known ones), RuntimeError for wrong act_args.
ActSpec parse_activation(c10::string_view name, at::ArrayRef<double> args);

// The op-level name and act_args of a spec (the inverse of parse_activation).
std::vector<double> act_args_of(const ActSpec& s);

at::Tensor apply_activation(const at::Tensor& t, const ActSpec& s, bool inplace);

// The backward prologue with ATen ops (any device): (grad w.r.t. the pre-activation, grad_bias or an
// empty tensor when bias_grad is false). `saved` is what grad_from_output says backward keeps.
std::tuple<at::Tensor, at::Tensor> act_backward_aten(const at::Tensor& grad_out, const at::Tensor& saved,
                                                     const ActSpec& act, bool bias_grad);

}  // namespace fastpipe::conv
