// The device runtime (core/cuda.h) and tensors' devices on a machine without a GPU: no device,
// a reason that says why, and errors that name both devices where tensors meet. On a machine
// with a GPU the same binary finds it (the first test then checks that; scripts/gpu-check runs
// it there).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "cohort/core/cuda.h"
#include "cohort/core/error.h"
#include "cohort/tensor/device_allocator.h"
#include "cohort/tensor/tensor.h"

namespace {

namespace cuda = cohort::cuda;
using cohort::tensor::Device;
using cohort::tensor::DType;
using cohort::tensor::Tensor;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const cohort::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Device, TheRuntimeSaysWhetherItWasBuiltAndWhyThereIsNoDevice) {
#ifdef COHORT_CUDA_BUILT
  EXPECT_TRUE(cuda::built());
#else
  EXPECT_FALSE(cuda::built());
#endif
  if (cuda::device_count() > 0) {
    EXPECT_TRUE(cuda::unavailable_reason().empty());
    EXPECT_FALSE(cuda::info(0).name.empty());
    return;
  }
  const std::string why = cuda::unavailable_reason();
  ASSERT_FALSE(why.empty());
  if (cuda::built()) {
    EXPECT_EQ(why.find("no GPU parts"), std::string::npos) << why;
  } else {
    EXPECT_NE(why.find("this build of Cohort has no GPU parts"), std::string::npos) << why;
  }
  const std::string e = error_of([] { cuda::use_device(0, "--device cuda (local rank 0)"); });
  EXPECT_NE(e.find("--device cuda (local rank 0): " + why), std::string::npos) << e;
  EXPECT_FALSE(cuda::device_chosen());
  const std::string mem = error_of([] { cohort::tensor::DeviceAllocator::cuda(); });
  EXPECT_NE(mem.find(why), std::string::npos) << mem;
  const std::string t = error_of([] { Tensor::empty_on(Device::cuda, {2, 3}, DType::f32); });
  EXPECT_NE(t.find(why), std::string::npos) << t;
}

// Tensors in device memory are never read by the host's loops, and two tensors that meet at a
// layer must be on one device; memory wrapped as a device's (as a CUDA tensor of torch's is)
// carries its device, so the checks run here without a GPU and never touch the memory.
TEST(Device, HostLoopsRefuseDeviceTensorsAndMixedDevicesAreNamed) {
  std::vector<float> storage(6, 1.0f);
  Tensor dev = Tensor::wrap(storage.data(), {2, 3}, DType::f32, cohort::tensor::Order::contiguous,
                            Device::cuda);
  Tensor host = Tensor::zeros({2, 3});
  EXPECT_EQ(dev.device(), Device::cuda);
  std::string e = error_of([&] { cohort::tensor::add_(host, dev); });
  EXPECT_NE(e.find("add_ runs on the CPU, and its tensor [2, 3] is on cuda"), std::string::npos)
      << e;
  e = error_of([&] { cohort::tensor::sum(dev); });
  EXPECT_NE(e.find("sum runs on the CPU"), std::string::npos) << e;
  e = error_of([&] { dev.fill_(2.0f); });
  EXPECT_NE(e.find("fill_ runs on the CPU"), std::string::npos) << e;
  e = error_of(
      [&] { cohort::tensor::require_same_device("Conv2d", "input", dev, "weight", host); });
  EXPECT_NE(e.find("Conv2d: the input is on cuda and the weight on cpu"), std::string::npos) << e;
  EXPECT_TRUE(error_of([&] {
                cohort::tensor::require_same_device("Conv2d", "input", host, "weight", host);
              }).empty());
  // A copy to or from the device needs one.
  if (cuda::device_count() == 0) {
    e = error_of([&] { host.copy_(dev); });
    EXPECT_NE(e.find(cuda::unavailable_reason()), std::string::npos) << e;
  }
  EXPECT_EQ(storage[0], 1.0f);  // nothing wrote through the device tensor
}

}  // namespace
