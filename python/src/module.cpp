// epcomm._epcomm: the host engine's buffers over shared memory, for CPU
// tensors. epcomm/buffer.py builds DeepEP's Buffer API on top of it.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "epcomm/core/error.hpp"
#include "group_bootstrap.hpp"

namespace epcomm::python {

// epcomm.Error: a RuntimeError carrying epcomm::error's rank, op, peer (None
// when the failure names no peer) and cause.
void bind_errors(py::module_& m) {
  static py::exception<error> type(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const error& e) {
      py::object exc = py::reinterpret_borrow<py::object>(type.ptr())(e.what());
      exc.attr("rank") = e.rank();
      exc.attr("op") = e.op();
      exc.attr("peer") = e.peer() == no_peer ? py::object(py::none()) : py::int_(e.peer());
      exc.attr("cause") = e.cause();
      PyErr_SetObject(type.ptr(), exc.ptr());
    }
  });
}

void bind_bootstrap(py::module_& m) {
  py::class_<group_bootstrap>(m, "GroupBootstrap")
      .def(py::init<int, int, int, int, py::function, py::function>(), py::arg("rank"),
           py::arg("world_size"), py::arg("local_rank"), py::arg("local_world_size"),
           py::arg("all_gather"), py::arg("barrier"))
      .def_property_readonly("rank", &group_bootstrap::rank)
      .def_property_readonly("world_size", &group_bootstrap::world_size);
}

}  // namespace epcomm::python

PYBIND11_MODULE(_epcomm, m) {
  m.attr("__version__") = EPCOMM_VERSION;
  epcomm::python::bind_errors(m);
  epcomm::python::bind_bootstrap(m);
  epcomm::python::bind_normal(m);
  epcomm::python::bind_low_latency(m);
}
