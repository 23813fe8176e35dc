// COHORT_BACKEND=nccl at world 1 on a GPU: every collective of the interface on device buffers,
// against what a group of one must give, each Work completed by the watchdog through its event.
// Label gpu: scripts/gpu-check runs it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "cohort/comm/communicator.h"
#include "cohort/core/cuda.h"
#include "cohort/core/error.h"
#include "testing/gpu.h"

namespace {

namespace comm = cohort::comm;
namespace cuda = cohort::cuda;

struct DeviceFloats {
  float* p = nullptr;
  size_t n = 0;
  explicit DeviceFloats(size_t count) : n(count) {
    p = static_cast<float*>(cuda::device_malloc(count * sizeof(float)));
  }
  ~DeviceFloats() { cuda::device_free(p); }
  void set(const std::vector<float>& v) {
    cuda::copy_to_device(p, v.data(), v.size() * 4, cuda::Stream::compute());
    cuda::Stream::compute().synchronize();
  }
  std::vector<float> get() const {
    std::vector<float> v(n);
    cuda::copy_to_host(v.data(), p, n * 4, cuda::Stream::compute());
    cuda::Stream::compute().synchronize();
    return v;
  }
};

TEST(NcclGpu, EveryCollectiveAtWorldOne) {
  COHORT_REQUIRE_GPU();
  comm::InitOptions o;
  o.backend = "nccl";
  auto c = comm::init(o);
  ASSERT_EQ(c->size(), 1);
  EXPECT_NE(c->describe().find("nccl"), std::string::npos) << c->describe();
  const size_t n = 1 << 20;
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 1.0f);
  DeviceFloats a(n), b(n);
  a.set(v);
  using comm::DataType;
  using comm::RedOp;
  auto expect_copy = [&](const char* what, comm::Work w) {
    w.wait();
    EXPECT_EQ(w.algorithm(), "nccl") << what;
    EXPECT_EQ(b.get(), v) << what;
    b.set(std::vector<float>(n, 0.0f));
  };
  expect_copy("allreduce", c->allreduce(a.p, b.p, n, DataType::f32, RedOp::sum));
  expect_copy("allreduce avg", c->allreduce(a.p, b.p, n, DataType::f32, RedOp::avg));
  expect_copy("reduce_scatter", c->reduce_scatter(a.p, b.p, n, DataType::f32, RedOp::sum));
  expect_copy("allgather", c->allgather(a.p, b.p, n, DataType::f32));
  expect_copy("broadcast", c->broadcast(a.p, b.p, n, DataType::f32, 0));
  expect_copy("reduce", c->reduce(a.p, b.p, n, DataType::f32, RedOp::max, 0));
  expect_copy("alltoall", c->alltoall(a.p, b.p, n, DataType::f32));
  expect_copy("gather", c->gather(a.p, b.p, n, DataType::f32, 0));
  expect_copy("scatter", c->scatter(a.p, b.p, n, DataType::f32, 0));
  c->barrier().wait();
  // In place, several in flight: they complete in order.
  std::vector<comm::Work> ws;
  for (int i = 0; i < 8; ++i) ws.push_back(c->allreduce(a.p, a.p, n, DataType::f32, RedOp::sum));
  for (auto& w : ws) w.wait();
  EXPECT_EQ(a.get(), v);
}

// The flight recorder keeps NCCL calls too: an aborted communicator dumps its last calls where
// COHORT_FLIGHT_DIR says, for `cohort doctor`, and later calls fail naming the abort.
TEST(NcclGpu, AbortDumpsTheFlightRecorder) {
  COHORT_REQUIRE_GPU();
  const std::string dir = "/tmp/cohort-nccl-flight-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  ::setenv("COHORT_FLIGHT_DIR", dir.c_str(), 1);
  comm::InitOptions o;
  o.backend = "nccl";
  auto c = comm::init(o);
  ::unsetenv("COHORT_FLIGHT_DIR");
  DeviceFloats a(1024);
  c->allreduce(a.p, a.p, 1024, comm::DataType::f32, comm::RedOp::sum).wait();
  c->abort("the test");
  std::ifstream f(dir + "/nccl.rank-0.json");
  ASSERT_TRUE(f) << "no dump in " << dir;
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_NE(text.str().find("allreduce"), std::string::npos) << text.str();
  EXPECT_THROW(c->barrier().wait(), cohort::CommError);
  std::filesystem::remove_all(dir);
}

}  // namespace
