// cohort._C: the pieces of Cohort that Python reaches. `import cohort` imports torch.distributed
// first, so that torch's ProcessGroup and Store types are known to pybind11 here.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include "cohort/core/error.h"
#include "loader.h"
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
  m.def("_drain_groups", &cohort::python::ProcessGroupCohort::drain_all,
        py::call_guard<py::gil_scoped_release>(),
        "waits until no group's completion thread holds a call (run at interpreter exit)");

  m.def(
      "job_env",
      [] {
        const cohort::comm::JobEnv j = cohort::comm::detect_job_env();
        py::dict d;
        d["rank"] = j.rank;
        d["world"] = j.world;
        d["local_rank"] = j.local_rank;
        d["local_world"] = j.local_world;
        d["master_addr"] = j.master_addr;
        d["master_port"] = j.master_port;
        d["launcher"] = j.launcher;
        return d;
      },
      "who this process is in its job, as Cohort reads it (torchrun, cohort launch, Open MPI, "
      "Slurm)");

  namespace data = cohort::data;
  py::class_<data::PipelineOptions>(m, "PipelineOptions")
      .def(py::init<>())
      .def_readwrite("batch", &data::PipelineOptions::batch)
      .def_readwrite("workers", &data::PipelineOptions::workers)
      .def_readwrite("prefetch", &data::PipelineOptions::prefetch)
      .def_readwrite("size", &data::PipelineOptions::size)
      .def_readwrite("seed", &data::PipelineOptions::seed)
      .def_readwrite("train", &data::PipelineOptions::train)
      .def_readwrite("crop_scale_min", &data::PipelineOptions::crop_scale_min)
      .def_readwrite("crop_ratio_min", &data::PipelineOptions::crop_ratio_min)
      .def_readwrite("crop_ratio_max", &data::PipelineOptions::crop_ratio_max)
      .def_readwrite("rotation", &data::PipelineOptions::rotation)
      .def_readwrite("resize", &data::PipelineOptions::resize)
      .def_readwrite("hflip", &data::PipelineOptions::hflip)
      .def_readwrite("vflip", &data::PipelineOptions::vflip)
      .def_readwrite("brightness", &data::PipelineOptions::brightness)
      .def_readwrite("contrast", &data::PipelineOptions::contrast)
      .def_readwrite("channels", &data::PipelineOptions::channels)
      .def_readwrite("mean", &data::PipelineOptions::mean)
      .def_readwrite("std", &data::PipelineOptions::std)
      .def_readwrite("fail_on_corrupt", &data::PipelineOptions::fail_on_corrupt)
      .def_readwrite("world", &data::PipelineOptions::world)
      .def_readwrite("rank", &data::PipelineOptions::rank)
      .def_readwrite("shuffle", &data::PipelineOptions::shuffle)
      .def_readwrite("drop_last", &data::PipelineOptions::drop_last)
      .def("set_window",
           [](data::PipelineOptions& o, double center, double width) {
             o.window = data::Window{center, width};
           })
      .def("set_output",
           [](data::PipelineOptions& o, const std::string& dtype, bool channels_last) {
             if (dtype == "float32") {
               o.out = data::OutType::f32;
             } else if (dtype == "bfloat16") {
               o.out = data::OutType::bf16;
             } else if (dtype == "uint8") {
               o.out = data::OutType::u8;
             } else {
               throw py::value_error("dtype '" + dtype + "': expected float32, bfloat16 or uint8");
             }
             o.layout = channels_last ? data::Layout::nhwc : data::Layout::nchw;
           })
      .def("set_idct", [](data::PipelineOptions& o, bool accurate) {
        o.idct = accurate ? data::Idct::accurate : data::Idct::fast;
      });

  py::class_<cohort::python::PipelineLoader, std::shared_ptr<cohort::python::PipelineLoader>>(
      m, "PipelineLoader")
      .def(py::init<const std::string&, data::PipelineOptions>())
      .def("start_epoch", &cohort::python::PipelineLoader::start_epoch)
      .def("next", &cohort::python::PipelineLoader::next)
      .def("batches_per_epoch", &cohort::python::PipelineLoader::batches_per_epoch)
      .def("dataset_size", &cohort::python::PipelineLoader::dataset_size)
      .def("num_classes", &cohort::python::PipelineLoader::num_classes)
      .def("class_names", &cohort::python::PipelineLoader::class_names)
      .def("channels", &cohort::python::PipelineLoader::channels)
      .def("stats", [](const cohort::python::PipelineLoader& l) {
        auto s = l.stats();
        py::dict d;
        d["images"] = s.images;
        d["skipped"] = s.skipped;
        d["batches"] = s.batches;
        d["decode_s"] = s.decode_s;
        d["resize_s"] = s.resize_s;
        d["consumer_wait_s"] = s.consumer_wait_s;
        return d;
      });
  // Cohort's errors (a corrupt file under fail_on_corrupt, a bad source) as RuntimeError with
  // Cohort's message, which names the file.
  py::register_exception<cohort::Error>(m, "Error", PyExc_RuntimeError);
}
