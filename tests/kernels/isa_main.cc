// main() of kernels_<isa>_test: the kernel tests against one ISA's copy of the kernels
// (kernels/cpu/isa.h), run only where this CPU has that ISA.
#include <gtest/gtest.h>

#include <cstdio>

#include "keel/kernels/cpu_isa.h"

int main(int argc, char** argv) {
  keel::kernels::CpuIsa isa;
  if (!keel::kernels::ParseCpuIsa(KEEL_TEST_ISA, &isa)) return 2;
  if (!keel::kernels::CpuIsaAvailable(isa)) {
    std::printf("skipped: this CPU has no %s, so its kernels cannot run here\n", KEEL_TEST_ISA);
    return 77;
  }
  std::printf("kernels compiled for %s\n", KEEL_TEST_ISA);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
