// The engines of the fused convolution and the choice among them. Each device type has "eager" (ATen's
// convolution, then the activation in place) and the candidates its backend registers (cpu/: oneDNN;
// cuda/: cuDNN + fastpipe's epilogue kernel). Every new call key is timed once on each candidate that
// can run it and the fastest is cached; FASTPIPE_CONV_ENGINE forces one (fastpipe/nn/_engines.py
// documents the rules).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/FunctionRef.h>

#include <array>
#include <string>
#include <vector>

#include "ops/conv_act.h"

namespace fastpipe::conv {

// What an engine computes: the output in [0] (forward), or the input, weight and bias gradients
// (backward; undefined where ConvArgs::need does not ask for them).
using EngineOut = std::array<at::Tensor, 3>;

// One way to compute a ConvArgs: a forward engine has `run`, returning the result, preferably already
// in args.format; a backward engine `run_backward`.
// `why_not` says whether the candidate can run a call on this machine: nullptr when it can, else the
// reason (a static string, shown in the warning when a forced engine falls back to eager).
// `validated`: its tests have passed on real hardware of its device type (recorded under
// benchmarks/results/); one that has not is never chosen by timing, only run when FASTPIPE_CONV_ENGINE
// names it.
struct Candidate {
  const char* name;
  const char* (*why_not)(const ConvArgs&);
  at::Tensor (*run)(const ConvArgs&) = nullptr;
  bool validated = true;
  EngineOut (*run_backward)(const ConvArgs&) = nullptr;
};

struct DeviceHooks {
  void (*synchronize)(c10::DeviceIndex);  // wait for queued work (timing); null where calls are synchronous
  bool (*capturing)();                   // a graph capture is in progress (no timing then); may be null
  // The device's own time of the work `fn` queues (CUDA events on the current stream); null: the host's
  // clock around fn between synchronizations.
  double (*elapsed_ms)(c10::DeviceIndex, c10::function_ref<void()> fn);
};

// Adds a device type's forward candidates, or backward ones, after "eager" (the plain ATen path every
// device has: at::convolution, or at::convolution_backward). The two are chosen apart, per key: an
// engine name may have both (FASTPIPE_CONV_ENGINE=<name> forces both). Call it from a static
// initialiser; returns true so that it can initialise a static.
bool register_engines(c10::DeviceType type, DeviceHooks hooks, std::vector<Candidate> candidates,
                      bool backward = false);

// Computes `a` with the engine of its key: forced, cached, or timed now. run_engine takes forward calls,
// run_backward_engine backward ones (backward_args).
at::Tensor run_engine(const ConvArgs& a);
EngineOut run_backward_engine(const ConvArgs& a);

// Where the choice's warnings go (each is given once): the Python module installs a sink that raises
// them as Python warnings (torch.ops calls do not route TORCH_WARN to Python); without one they go to
// TORCH_WARN.
void set_warning_sink(void (*sink)(const std::string& message));

// The introspection ops (schemas in conv_act.cpp): engine names per device type, the cached choices,
// forgetting them (with failures and warnings), and the choice rule on given timings (each candidate's
// fastest round, and the median of its per-round time over eager's; eager first).
std::vector<std::string> engine_names(c10::string_view device, bool backward);
std::vector<std::string> engine_cache();
void engine_clear();
// Forces an engine for every call ("auto" or "": the timed choice); returns the previous setting.
// FASTPIPE_CONV_ENGINE sets it when fastpipe loads.
std::string engine_force(c10::string_view name);
// The cached choices of a device type's keys as text, and adding such text to the cache (keys already
// cached keep their choice; returns how many were added): fastpipe/nn/_engines.py keeps them in a file
// so that the next run makes the same choices without timing.
// Each line carries the margin the choice was made by; a thin one is re-timed at its first call.
std::vector<std::string> engine_export(c10::string_view device);
int64_t engine_import(std::vector<std::string> lines);
// Forgets a device type's cached choices (with thin_only, the timed ones whose margin is thin) so that
// their next calls are timed; returns their keys as engine_export writes them.
std::vector<std::string> engine_forget(c10::string_view device, bool thin_only);
// Whether a device type's choices are saved at exit (only what the report says; _engines.py saves them).
// Returns the previous setting.
bool engine_persist(c10::string_view device, bool on);
int64_t pick_engine_op(at::ArrayRef<double> fastest, at::ArrayRef<double> ratio);
// Test hook: with `on`, the candidates not yet validated are timed too (as if validated), so that a GPU test
// can make a new key timeable; forgets every choice. Returns the previous setting.
bool engine_time_unvalidated(bool on);
// Test hook: adds `amount` to engine `name`'s output where the tuner checks it against eager's (the
// choice's output check; 0 turns it off). Calls outside the tuner's check are untouched.
void engine_perturb_check(c10::string_view name, double amount);

}  // namespace fastpipe::conv
