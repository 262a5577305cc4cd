// Activations of the fused convolution ops, shared by the op layer (parsing, CPU paths) and the CUDA
// kernels. Plain C++: no torch or CUDA headers, so a CPU-only build can include it.
//
// The backward pass reads the activation's derivative from a saved tensor: the output for identity,
// relu, hardtanh, sigmoid, tanh and leaky_relu with a slope >= 0, the pre-activation otherwise (the
// caller, fastpipe/ops.py, decides). The piecewise-linear formulas give the same from either.
#pragma once

namespace fastpipe {

enum class Act : int {
  Identity,
  Relu,
  Hardtanh,   // alpha = min, beta = max (relu6 is hardtanh(0, 6))
  LeakyRelu,  // alpha = negative slope
  Silu,
  Gelu,       // exact (erf)
  GeluTanh,   // tanh approximation
  Sigmoid,
  Tanh,
  Hardswish,
};

// Parameters of an activation: which one, and its (at most two) scalar arguments.
struct ActSpec {
  Act act = Act::Identity;
  double alpha = 0.0;
  double beta = 0.0;
};

}  // namespace fastpipe
