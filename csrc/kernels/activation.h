// The activations of the fused convolution ops: one table (op-level name, arguments, what backward
// keeps) shared by the op layer (parsing, CPU paths, autograd), the CUDA kernels and Python
// (fastpipe._C.CONV_ACTIVATIONS, checked against fastpipe/nn/_activations.py by tests/test_tables.py).
// Plain C++: no torch or CUDA headers, so a CPU-only build can include it.
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

struct ActInfo {
  Act act;
  const char* name;  // the ops' `activation` argument
  int nargs;         // values in the ops' `act_args`
};

inline constexpr ActInfo kActivations[] = {
    {Act::Identity, "identity", 0}, {Act::Relu, "relu", 0},         {Act::Hardtanh, "hardtanh", 2},
    {Act::LeakyRelu, "leaky_relu", 1}, {Act::Silu, "silu", 0},       {Act::Gelu, "gelu", 0},
    {Act::GeluTanh, "gelu_tanh", 0}, {Act::Sigmoid, "sigmoid", 0}, {Act::Tanh, "tanh", 0},
    {Act::Hardswish, "hardswish", 0},
};

inline constexpr const ActInfo& act_info(Act a) {
  return kActivations[static_cast<int>(a)];  // the table is in enum order (static_assert below)
}

namespace detail {
constexpr bool table_in_enum_order() {
  int i = 0;
  for (const auto& e : kActivations)
    if (static_cast<int>(e.act) != i++) return false;
  return true;
}
}  // namespace detail
static_assert(detail::table_in_enum_order(), "kActivations must list the activations in enum order");

// What backward keeps to take the activation's derivative: the output (which exists anyway) when it
// determines the derivative, else the pre-activation. The piecewise-linear formulas give the same from
// either; a negative leaky_relu slope flips the sign, so the output no longer tells the branch.
inline constexpr bool grad_from_output(const ActSpec& s) {
  switch (s.act) {
    case Act::Identity:
    case Act::Relu:
    case Act::Hardtanh:
    case Act::Sigmoid:
    case Act::Tanh:
      return true;
    case Act::LeakyRelu:
      return s.alpha >= 0;
    default:
      return false;
  }
}

}  // namespace fastpipe
