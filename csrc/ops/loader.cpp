#include "ops/bindings.h"

namespace fastpipe {
void bind_loader(pybind11::module& m) {}
}  // namespace fastpipe
