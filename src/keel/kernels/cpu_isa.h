// Which instruction set keel's own CPU kernels run with: chosen once per process from what the CPU
// reports, so that one binary is fast on every x86-64 CPU (oneDNN chooses its GEMMs' the same
// way). The kernels are compiled once per ISA (kernels/cpu/isa.h); everything else is x86-64-v2.
//
//   KEEL_CPU_ISA=avx2 keel train ...   # a narrower set than the CPU's, to compare or to bisect
#pragma once

#include <string>

namespace keel::kernels {

class Backend;

enum class CpuIsa { kSse42, kAvx2, kAvx512 };

// "x86-64-v2", "avx2" (x86-64-v3), "avx512" (x86-64-v4).
const char* IsaName(CpuIsa isa);
// Accepts IsaName's words and "sse4.2"; false for anything else.
bool ParseCpuIsa(const std::string& s, CpuIsa* out);
// Whether this CPU runs `isa`'s instructions (the OS saving their registers included) and this
// keel was built with kernels for it.
bool CpuIsaAvailable(CpuIsa isa);
// The widest available ISA, or KEEL_CPU_ISA's when set; fixed at the first call. Throws BadInput
// naming KEEL_CPU_ISA when it is not a known ISA or not available here.
CpuIsa ChosenCpuIsa();
// Narrows the choice to `isa` when that is narrower: a job whose ranks run on different CPU
// generations runs the narrowest set everywhere. Call it before the backend is first used.
void LimitCpuIsa(CpuIsa isa);
// Whether a run's products are held to AVX2 on a wider CPU: keel's kernels chosen narrower than
// AVX-512 and oneDNN limited by ONEDNN_MAX_CPU_ISA=AVX2 (bench/perf_smoke.sh's quickstart-avx2).
// MFU is then measured against 256-bit FMAs (monitor::PeakScope::kAvx2), what its products may use.
bool ProductsHeldToAvx2();
// The CPU backend whose kernels are compiled for `isa` (available or not: the caller checks).
const Backend& CpuBackendFor(CpuIsa isa);

// Whether bf16 matrix products run in fp32 on widened copies (kernels/cpu/matmul.h) even where
// oneDNN has a bf16 kernel: true where this CPU's fastest bf16 instruction gives fewer FLOP/s than
// its fp32 FMA (core/cpu_rates.h, measured on one thread in ~30 ms at the first call). vdpbf16ps
// runs at half the FMA rate on Sapphire Rapids, whose AMX a hypervisor may hide: 169 against 349
// GFLOP/s on two such vCPUs, where widening took GPT-2 124M's bf16 step from 5.2 to 3.3 s. The
// ratio is a property of the core (0.5 there, 2 on AMD Zen 4, 15-30 with AMX), far from 1, so the
// choice does not flip from run to run. KEEL_BF16_PRODUCTS=native (oneDNN's bf16 kernels wherever
// it has them) or fp32 (always widened) chooses instead; another value throws BadInput naming it.
// Fixed at the first call.
bool Bf16ProductsInFp32();

// Flush-to-zero and denormals-are-zero on the calling thread and on every thread of its OpenMP
// pool; threads started later inherit them from their starter. As a model trains, backward's fp32
// intermediates drift into subnormal range, and each subnormal operand costs the x86 core a
// microcode assist: GPT-2 124M's backward grew 15-30% after its first 30 steps on an AMX Xeon until
// they were flushed, and the values lost are below 1.2e-38. (XLA and TensorFlow flush on CPU
// too.) Not done on other architectures.
void FlushDenormals();
// Whether the calling thread and every thread of its OpenMP pool flush them (false off x86-64).
bool DenormalsFlushed();

}  // namespace keel::kernels
