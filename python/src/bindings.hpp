// The extension module's parts, one translation unit each (pybind11 is slow
// to compile; two cores build them side by side).
#pragma once

#include <pybind11/pybind11.h>

namespace epcomm::python {

void bind_errors(pybind11::module_& m);
void bind_bootstrap(pybind11::module_& m);
void bind_normal(pybind11::module_& m);
void bind_low_latency(pybind11::module_& m);

}  // namespace epcomm::python
