#include "keel/kernels/backend.h"

#include "keel/core/error.h"
#include "keel/core/plugin.h"
#include "keel/kernels/cpu_isa.h"

namespace keel::kernels {

const char* DeviceName(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

bool ParseDevice(const std::string& s, Device* out) {
  if (s == "cpu")
    *out = Device::kCpu;
  else if (s == "cuda")
    *out = Device::kCuda;
  else
    return false;
  return true;
}

bool CudaBuilt() { return !PluginPath("cuda").empty(); }

void Backend::ToF16(f16*, const float*, size_t) const {
  ThrowRuntime(name() + " backend: no fp16 (train.precision = \"fp16\" runs on the CPU)");
}

namespace {
[[noreturn]] void NoBf16Grads(const std::string& backend) {
  ThrowRuntime(backend +
               " backend: no bf16 gradients (optim.grad_dtype = \"bf16\" runs on the CPU)");
}
}  // namespace

double Backend::SumSquares(const bf16*, size_t) const { NoBf16Grads(name()); }

void Backend::MatmulFp8Forward(bf16*, const bf16*, const bf16*, const float*, int, int, int, float,
                               float, bool) const {
  ThrowRuntime(name() + " backend: no native fp8 products (NativeFp8 is false: emulate)");
}
void Backend::MatmulFp8Backward(bf16*, float*, const bf16*, const bf16*, const bf16*, int, int, int,
                                float, float, float) const {
  ThrowRuntime(name() + " backend: no native fp8 products (NativeFp8 is false: emulate)");
}
void Backend::AccumulateBf16(bf16*, const float*, size_t) const { NoBf16Grads(name()); }
void Backend::AddBf16To(float*, const bf16*, size_t) const { NoBf16Grads(name()); }

const Backend& Cpu() { return CpuBackendFor(ChosenCpuIsa()); }

const Backend& Get(Device d) {
  if (d == Device::kCpu) return Cpu();
  // The CUDA backend is a plugin (core/plugin.h), loaded here the first time a GPU is asked for.
  auto backend =
      PluginEntry<const Backend* (*)()>("cuda", "keel_cuda_backend", "[train] device = \"cuda\"");
  return *backend();
}

}  // namespace keel::kernels
