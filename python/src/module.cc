// cohort._C: the pieces of Cohort that Python reaches. `import cohort` imports torch.distributed
// first, so that torch's ProcessGroup and Store types are known to pybind11 here.
#include <pybind11/chrono.h>
#include <torch/python.h>

#include "process_group.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "Cohort's collectives as a torch.distributed backend";
  py::module::import("torch.distributed");
  py::class_<cohort::python::ProcessGroupCohort, c10d::ProcessGroup,
             c10::intrusive_ptr<cohort::python::ProcessGroupCohort>>(m, "ProcessGroupCohort")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int, std::chrono::milliseconds>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def("describe", &cohort::python::ProcessGroupCohort::describe,
           "the backend, its transports and its algorithm policy");
}
