// The measurements behind `keel preflight`. Each check measures on this rank first (an error is
// caught and becomes a no-go), then gathers the figure of every rank, so that a failure on one
// rank never leaves the others waiting in a collective.
#include "keel/cli/preflight_checks.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "keel/cli/verbs.h"
#include "keel/core/error.h"
#include "keel/core/validate.h"
#include "keel/data/dataset.h"
#include "keel/kernels/backend.h"
#include "keel/model/params.h"
#include "keel/model/transformer.h"
#include "keel/monitor/flops.h"
#include "keel/monitor/machine_probe.h"
#include "keel/optim/offload_tier.h"
#include "keel/parallel/comm.h"
#include "keel/parallel/state_bytes.h"
#include "keel/parallel/wire_reduce.h"
#include "keel/plan/checkpoint_interval.h"
#include "keel/plan/comm_time.h"
#include "keel/plan/hardware.h"
#include "keel/plan/memory.h"
#include "keel/resilience/build_id.h"
#include "keel/train/rank_agreement.h"
#include "keel/train/step.h"

namespace keel::cli::preflight {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string Fmt(const char* fmt, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), fmt, a, b, c);
  return buf;
}

void Wait(parallel::Work& w) {
  if (!w.Wait(600)) ThrowRuntime("preflight: a collective did not finish in 600 s (a lost rank?)");
}

// Every rank's value, in rank order. Floats carry rates and sizes to 7 digits, plenty here.
std::vector<double> Gather(parallel::Comm& comm, double x) {
  std::vector<float> send{float(x)}, recv(size_t(comm.size()));
  Wait(*comm.AllGatherAsync(send.data(), recv.data(), 1));
  return {recv.begin(), recv.end()};
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// The ranks whose value is more than 20% below the median, e.g. "1, 3".
std::string SlowRanks(const std::vector<double>& v) {
  const double med = Median(v);
  std::string out;
  for (size_t r = 0; r < v.size(); ++r)
    if (v[r] < 0.8 * med) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// Ranks on this rank's host: Open MPI says; otherwise assume all of them are here.
int LocalRanks(const Context& c) {
  const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int n = s ? std::atoi(s) : c.comm->size();
  return std::clamp(n, 1, c.comm->size());
}

plan::ModelSpec Spec(const Context& c) { return plan::SpecOf(c.model_name, c.model, c.seq); }

// --efficiency, or what `keel plan --accelerator this-cpu` assumes for the precision.
double Efficiency(const Context& c, DType dtype) {
  if (c.efficiency > 0) return c.efficiency;
  plan::Accelerator cpu;
  cpu.name = "this-cpu";
  return plan::DefaultEfficiency(cpu, dtype == DType::kF32);
}

plan::Recompute PlanRecompute(model::Recompute r) {
  return r == model::Recompute::kNone   ? plan::Recompute::kNone
         : r == model::Recompute::kAttn ? plan::Recompute::kSelective
                                        : plan::Recompute::kFull;
}

template <typename T>
double MatmulRate(int M, int K, int N, double seconds) {
  std::vector<T> a(size_t(M) * K), w(size_t(N) * K), out(size_t(M) * N);
  for (size_t i = 0; i < a.size(); ++i) a[i] = FromFloat<T>(float(i % 7) * 0.01f);
  for (size_t i = 0; i < w.size(); ++i) w[i] = FromFloat<T>(float(i % 5) * 0.01f);
  const kernels::Backend& cpu = kernels::Cpu();
  cpu.MatmulForward<T>(out.data(), a.data(), w.data(), nullptr, M, K, N);  // builds the kernel
  long calls = 0;
  const auto t0 = Clock::now();
  do {
    cpu.MatmulForward<T>(out.data(), a.data(), w.data(), nullptr, M, K, N);
    ++calls;
  } while (Since(t0) < seconds);
  return 2.0 * M * K * N * double(calls) / Since(t0);
}

}  // namespace

Row CheckSoftware(Context& c) {
  Row row{"software", "", "", "go", ""};
  // The keel binary itself stands for its build; compiler and library versions say why two
  // builds differ.
  const uint64_t keel_hash = resilience::ExecutableHash();
  const dnnl_version_t* dv = dnnl_version();
  char line[512];
  std::snprintf(line, sizeof(line), "keel %08llx, gcc %s, %s, oneDNN %d.%d.%d",
                (unsigned long long)(keel_hash >> 32), __VERSION__,
                parallel::MpiLibraryVersion().c_str(), dv->major, dv->minor, dv->patch);
  row.measured = line;
  // KEEL_BUILD_TAG: anything else the ranks must agree on, e.g. a container image digest.
  if (const char* tag = std::getenv("KEEL_BUILD_TAG")) row.measured += std::string(", tag ") + tag;
  const uint64_t h = XXH3_64bits(row.measured.data(), row.measured.size());
  // Four 16-bit pieces: each is exact in a float.
  std::vector<float> send(4), recv(4 * size_t(c.comm->size()));
  for (int i = 0; i < 4; ++i) send[i] = float((h >> (16 * i)) & 0xffff);
  Wait(*c.comm->AllGatherAsync(send.data(), recv.data(), 4));
  std::string differ;
  for (int r = 1; r < c.comm->size(); ++r)
    if (!std::equal(recv.begin() + 4L * r, recv.begin() + 4L * r + 4, recv.begin()))
      differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  row.expected = "the same on all " + std::to_string(c.comm->size()) + " rank(s)";
  if (!differ.empty()) {
    row.verdict = "no-go";
    row.reason = "rank(s) " + differ + " run a different build or library than rank 0";
  }
  row.data = {{"keel_hash", keel_hash}, {"mismatch_ranks", differ}};
  return row;
}

Row CheckMatmul(Context& c, DType dtype) {
  Row row{std::string("matmul ") + DTypeName(dtype), "", "", "go", ""};
  // The run's largest product: the MLP's (B·T, C) x (C, 4C).
  const int M = c.micro_batch * c.seq, K = c.model.n_embd, N = 4 * c.model.n_embd;
  const double seconds = c.quick ? 0.1 : 1.0;
  double local = 0;
  try {
    local = dtype == DType::kBF16 ? MatmulRate<bf16>(M, K, N, seconds)
                                  : MatmulRate<float>(M, K, N, seconds);
  } catch (const std::exception& e) {
    row.reason = e.what();
  }
  const auto all = Gather(*c.comm, local);
  const double med = Median(all);
  const double peak = monitor::MachinePeak(dtype, c.threads).flops;
  const double eff = Efficiency(c, dtype);
  const double expected = peak * eff;
  if (dtype == c.dtype) c.matmul_flops = med;
  row.measured = Fmt("%.4g GFLOP/s (%.0fx%.0f", med / 1e9, M, K) + Fmt("x%.0f, median)", N);
  row.expected =
      Fmt("%.4g GFLOP/s (%.3g of the %.4g measured peak)", expected / 1e9, eff, peak / 1e9);
  row.data = {
      {"gflops_per_rank", all}, {"expected_gflops", expected / 1e9}, {"M", M}, {"K", K}, {"N", N}};
  const std::string slow = SlowRanks(all);
  if (med <= 0) {
    row.verdict = "no-go";
    if (row.reason.empty()) row.reason = "a rank measured nothing";
  } else if (!slow.empty()) {
    row.verdict = "warn";
    row.reason = "rank(s) " + slow + " more than 20% below the median";
  } else if (med < 0.5 * expected) {
    row.verdict = "warn";
    row.reason = "below half the planned rate: steps will take longer than planned (a busy host?)";
  }
  return row;
}

Row CheckStep(Context& c) {
  Row row{"step", "", "", "go", ""};
  // One optimizer step on one micro-batch, as the trainer runs it: forward and backward, the
  // global gradient norm, AdamW. Random weights and tokens; the time does not depend on them.
  double local = 0;
  std::string error;
  try {
    // The trainer's own step (train::TrainStep), on this rank alone.
    auto alone = parallel::MakeLocalComm();
    train::StepSpec spec;
    spec.model = c.model;
    spec.dtype = c.dtype;
    spec.layout.micro_batch = c.micro_batch;
    spec.seq_len = c.seq;
    spec.recompute = c.recompute;
    train::TrainStep st(spec, *alone);
    {
      std::vector<float> init(st.layout().total());
      model::InitParams(st.layout(), c.model, 1337, init.data());
      st.SetWeights(init.data());
    }
    auto next = [&](int32_t* tokens, int32_t* targets) {
      const size_t n = size_t(c.micro_batch) * c.seq;
      for (size_t i = 0; i < n; ++i) {
        tokens[i] = int32_t(i * 7919 % size_t(c.model.vocab_size));
        targets[i] = int32_t((i * 104729 + 1) % size_t(c.model.vocab_size));
      }
      return 0.0;
    };
    auto step = [&] {
      st.ForwardBackward(1, next, 1.0f / float(c.micro_batch * c.seq));
      st.Update(1e-4f, 1.0f);
    };
    const auto w0 = Clock::now();
    step();  // builds the kernels
    // Up to 3 timed steps within about 3 s, so that a large model keeps preflight short.
    const int reps = c.quick ? 1 : std::clamp(int(3.0 / Since(w0)), 1, 3);
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) step();
    local = Since(t0) / reps;
  } catch (const std::exception& e) {
    error = e.what();
    local = -1;
  }
  const auto all = Gather(*c.comm, local);
  const double slowest = *std::max_element(all.begin(), all.end());
  const double least = *std::min_element(all.begin(), all.end());
  if (least > 0) c.step_s = slowest;
  if (least < 0) {
    row.verdict = "no-go";
    row.measured = "failed";
    row.reason = error.empty() ? "a rank could not run a step" : error;
    return row;
  }
  // What `keel plan --accelerator this-cpu` predicts for the same micro-batch: keel's kernels
  // timed on the model's shapes (or the measured peak at --efficiency).
  const plan::ModelSpec spec = Spec(c);
  const double tokens = double(c.micro_batch) * c.seq;
  const double n = plan::TotalParams(spec);
  const double hw = tokens * plan::HardwareFlopsPerToken(spec, n, PlanRecompute(c.recompute));
  const double peak = monitor::MachinePeak(c.dtype, c.threads).flops;
  double rate = peak * c.efficiency;
  std::string how = Fmt("efficiency %.3g", c.efficiency) + Fmt(" of %.4g GFLOP/s", peak / 1e9);
  if (c.efficiency <= 0) {
    plan::Job job;
    job.model = spec;
    job.precision = c.dtype == DType::kF32 ? plan::Precision::kFp32 : plan::Precision::kBf16;
    job.global_batch = c.micro_batch;
    job.cluster.world = job.cluster.per_node = 1;
    MeasureKernels(job, c.micro_batch);
    rate = job.cluster.accel.measured_flops;
    how = Fmt("keel's kernels timed at %.4g GFLOP/s", rate / 1e9);
  }
  const double predicted = hw / rate;
  const double mfu = tokens * plan::ModelFlopsPerToken(spec, n) / (slowest * peak);
  row.measured = Fmt("%.3g s per micro-batch, %.4g tokens/s, MFU %.1f%% (slowest rank)", slowest,
                     tokens / slowest, 100 * mfu);
  row.expected = Fmt("%.3g s (keel plan on this-cpu: ", predicted) + how + ")";
  row.data = {{"step_s_per_rank", all}, {"predicted_s", predicted}, {"mfu", mfu}};
  const double off = slowest / predicted - 1;
  if (std::abs(off) > 0.25) {
    row.verdict = "warn";
    // The efficiency that would make the plan match: hardware FLOPs over time and peak.
    row.reason = Fmt("the plan is off by %+.0f%%; keel plan --efficiency %.3g matches this step",
                     100 * off, hw / (slowest * peak));
  }
  return row;
}

Row CheckMemoryBandwidth(Context& c) {
  Row row{"memory bandwidth", "", "> 1 GB/s (a sanity floor; no table figure for CPUs)", "go", ""};
  const double local =
      monitor::MeasureCopyRate(c.threads, size_t(c.quick ? 64 : 512) << 20, c.quick ? 2 : 5);
  const auto all = Gather(*c.comm, local);
  c.copy_bytes_per_s = Median(all);
  // A copy reads and writes every byte: memory traffic is twice the copy rate.
  row.measured = Fmt("%.4g GB/s (memcpy %.4g GB/s, median)", 2 * c.copy_bytes_per_s / 1e9,
                     c.copy_bytes_per_s / 1e9);
  row.data = {{"copy_bytes_per_s_per_rank", all}};
  if (2 * c.copy_bytes_per_s < 1e9) {
    row.verdict = "warn";
    row.reason = "memory is unusually slow";
  } else if (const std::string slow = SlowRanks(all); !slow.empty()) {
    row.verdict = "warn";
    row.reason = "rank(s) " + slow + " more than 20% below the median";
  }
  return row;
}

Row CheckMemory(Context& c) {
  Row row{"memory", "", "", "go", ""};
  plan::Job job;
  job.model = Spec(c);
  job.precision = c.dtype == DType::kF32 ? plan::Precision::kFp32 : plan::Precision::kBf16;
  job.accounting = plan::Accounting::kKeel;
  job.global_batch = c.global_batch;
  job.cluster.world = c.comm->size();
  job.cluster.per_node = c.comm->size();
  job.cluster.accel.memory_bytes = monitor::MemTotalBytes();
  const plan::Layout l =
      plan::Layout::Of({c.comm->size(), 1, 1, 0}, c.micro_batch, PlanRecompute(c.recompute));
  const plan::MemoryBreakdown mem = plan::EstimateMemory(job, l);
  // Ranks on one host share its memory.
  const auto avail = Gather(*c.comm, MemAvailableBytes() / LocalRanks(c));
  const double least = *std::min_element(avail.begin(), avail.end());
  row.measured = Fmt("%.4g GB available per rank (least of all ranks)", least / 1e9);
  row.expected = Fmt("%.4g GB planned peak per rank (state %.4g GB + activations %.4g GB)",
                     mem.used() / 1e9, mem.state.total() / 1e9, mem.activations / 1e9);
  row.data = {{"planned_bytes", mem.used()}, {"available_bytes_per_rank", avail}};
  if (mem.used() > least) {
    row.verdict = "no-go";
    row.reason = "the planned peak does not fit in the memory available";
  } else if (mem.used() > 0.8 * least) {
    row.verdict = "warn";
    row.reason = "less than 20% of the available memory would be left";
  }
  return row;
}

Row CheckCheckpoint(Context& c) {
  Row row{"checkpoint", "", "", "go", ""};
  const double n = double(plan::TotalParams(Spec(c)));
  const double state_per_rank = 12 * n / c.comm->size();  // fp32 master + 2 moments, sliced
  const size_t cap = size_t(c.quick ? 32 : 256) << 20;
  const size_t bytes =
      std::max<size_t>(1 << 20, std::min(size_t(state_per_rank), cap)) / 4096 * 4096;
  const std::string path =
      c.ckpt_dir + "/.preflight_rank" + std::to_string(c.comm->rank()) + ".tmp";
  double write_bps = 0, read_bps = 0;
  std::string error;
  // Ranks may share the folder: each looks before any creates it, and it is removed (when it
  // was not there before, and only if empty) after every rank is done with its file.
  const bool existed = std::filesystem::exists(c.ckpt_dir);
  c.comm->Barrier();
  try {
    std::filesystem::create_directories(c.ckpt_dir);
    std::vector<char> buf(bytes), back(bytes);
    for (size_t i = 0; i < bytes; ++i) buf[i] = char((i * 2654435761u) >> 24);
    const uint64_t want = XXH3_64bits(buf.data(), bytes);
    auto t0 = Clock::now();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) ThrowRuntime("cannot create " + path + ": " + std::strerror(errno));
    for (size_t off = 0; off < bytes;) {
      const ssize_t w = ::write(fd, buf.data() + off, std::min<size_t>(8 << 20, bytes - off));
      if (w <= 0) {
        ::close(fd);
        ThrowRuntime("write " + path + ": " + std::strerror(errno));
      }
      off += size_t(w);
    }
    // fsync: the bytes are on the device, as a checkpoint's must be before it commits.
    if (::fsync(fd) != 0 || ::close(fd) != 0)
      ThrowRuntime("fsync " + path + ": " + std::strerror(errno));
    write_bps = double(bytes) / Since(t0);
    t0 = Clock::now();
    std::ifstream in(path, std::ios::binary);
    in.read(back.data(), std::streamsize(bytes));
    if (size_t(in.gcount()) != bytes || XXH3_64bits(back.data(), bytes) != want)
      ThrowRuntime("read back " + path + ": the bytes differ from those written");
    read_bps = double(bytes) / Since(t0);
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::error_code ec;
  std::filesystem::remove(path, ec);
  c.comm->Barrier();
  if (!existed) std::filesystem::remove(c.ckpt_dir, ec);  // only if empty: leave no trace
  const auto writes = Gather(*c.comm, error.empty() ? write_bps : -1);
  const auto reads = Gather(*c.comm, error.empty() ? read_bps : -1);
  const double w = *std::min_element(writes.begin(), writes.end());
  row.data = {{"bytes_per_rank", bytes},
              {"write_bytes_per_s_per_rank", writes},
              {"read_bytes_per_s_per_rank", reads},
              {"state_bytes_per_rank", state_per_rank}};
  if (w <= 0) {
    row.verdict = "no-go";
    row.reason = error.empty() ? "a rank could not write or verify its checkpoint" : error;
    row.measured = "failed in " + c.ckpt_dir;
    return row;
  }
  // The interval that follows: the snapshot (a copy at the measured rate) blocks; every rank
  // writes its slice at the slowest rank's rate, all at once (the rate was measured that way).
  const double delta = state_per_rank / std::max(c.copy_bytes_per_s, 1e6);
  const double write_s = state_per_rank / w;
  // Job MTBF: node MTBF over the hosts the ranks span.
  const int hosts = std::max(1, c.comm->size() / LocalRanks(c));
  const double mtbf = c.node_mtbf_hours * 3600 / hosts;
  const double daly = std::max(plan::DalyInterval(delta, mtbf), write_s);
  row.measured = Fmt("write %.4g GB/s (fsync), read %.4g GB/s, %.0f MB verified", w / 1e9,
                     Median(reads) / 1e9, double(bytes) / 1e6) +
                 " in " + c.ckpt_dir;
  row.expected = Fmt("state %.4g GB/rank: written in %.3g s; save every %.3g min (Daly, ",
                     state_per_rank / 1e9, write_s, daly / 60) +
                 Fmt("%.0f host(s))", hosts);
  row.data["write_s"] = write_s;
  row.data["interval_s"] = daly;
  if (write_s > daly / 2) {
    row.verdict = "warn";
    row.reason = "writing the state takes more than half the checkpoint interval";
  }
  return row;
}

// The offload tier as the run will use it (optim::OffloadTier in [offload] dir, every rank at
// once): updates streamed through a slice of the state's size, timed, and the traffic of the
// whole state per step at that rate against the measured step.
Row CheckOffload(Context& c) {
  Row row{"offload", "", "", "go", ""};
  if (c.offload_dir.empty()) {
    row.verdict = "skip";
    row.reason = "no [offload] dir";
    return row;
  }
  const double n = double(plan::TotalParams(Spec(c))) / c.comm->size();
  parallel::StateShape shape;
  shape.working_bytes = c.dtype == DType::kF32 ? 4 : 2;
  shape = parallel::WithTiers(shape, c.tiers);
  const std::vector<int> eb = shape.tier_regions();
  const double per = double(shape.tier_bytes_per_elem()), tier_bytes = per * n;
  const size_t cap = size_t(c.quick ? 48 : 384) << 20;
  const size_t elems = std::max<size_t>(2048, size_t(std::min(tier_bytes, double(cap)) / per));
  const size_t chunk = parallel::OffloadChunkElems(size_t(c.offload_chunk), size_t(per), elems);
  double bps = -1;
  std::string error;
  try {
    optim::OffloadTier tier(c.offload_dir, elems, eb, chunk);
    auto touch = [&](void* const* p, size_t, size_t) { static_cast<char*>(p[0])[0] ^= 1; };
    tier.Stream(touch);  // the first pass reads blocks fallocate reserved
    const auto t0 = Clock::now();
    for (int i = 0; i < 2; ++i) tier.Stream(touch);
    bps = 2 * 2 * per * double(elems) / Since(t0);  // read and written, twice
  } catch (const std::exception& e) {
    error = e.what();
  }
  const auto all = Gather(*c.comm, bps);
  const double slowest = *std::min_element(all.begin(), all.end());
  row.data = {{"bytes_per_s_per_rank", all}, {"tier_bytes_per_rank", tier_bytes}};
  if (slowest <= 0) {
    row.verdict = "no-go";
    row.measured = "failed in " + c.offload_dir;
    row.reason = error.empty() ? "a rank could not stream through its tier" : error;
    return row;
  }
  // The update reads and writes the whole tier once a step; the step's compute runs the
  // micro-batches of the global batch (the step row measured one). With the weights' shard on
  // the tier, every micro-batch's forward and backward read it again.
  const double micro = std::max(1.0, double(c.global_batch) / (c.micro_batch * c.comm->size()));
  const double io_s =
      (2 * tier_bytes + (shape.working_offloaded() ? 2 * micro * 2 * n : 0)) / slowest;
  const double step_s = c.step_s * micro;
  row.measured = Fmt("%.4g GB/s per rank read+write, %.0f MB streamed", slowest / 1e9,
                     4 * per * double(elems) / 1e6) +
                 " in " + c.offload_dir;
  row.expected = Fmt("tier %.4g GB/rank: %.3g s of I/O per step against %.3g s of compute",
                     tier_bytes / 1e9, io_s, step_s);
  row.data["io_s"] = io_s;
  if (step_s > 0 && io_s > step_s) {
    row.verdict = "warn";
    row.reason = "the update is I/O-bound: the tier's traffic takes longer than the step's compute";
  }
  return row;
}

Row CheckData(Context& c) {
  Row row{"data", "", "", "go", ""};
  // What the run's compute consumes: the measured step's tokens/s (or, if it failed, the
  // measured matmul rate over the FLOPs per token).
  const plan::ModelSpec spec = Spec(c);
  const double per_token =
      plan::HardwareFlopsPerToken(spec, plan::TotalParams(spec), PlanRecompute(c.recompute));
  const double consume =
      c.step_s > 0 ? double(c.micro_batch) * c.seq / c.step_s : c.matmul_flops / per_token;
  row.expected = Fmt("%.4g tokens/s per rank (what the measured step consumes)", consume);
  // Every rank calls Gather, with or without a dataset, so that they stay in step.
  double local = 0;
  std::string error;
  if (!c.data_path.empty()) {
    try {
      const auto ds = data::TokenDataset::Open(c.data_path);
      const size_t window = size_t(c.seq) + 1;
      if (ds.size() <= window) ThrowBadInput(c.data_path + ": fewer tokens than one sample");
      std::vector<int32_t> buf(window);
      uint64_t x = 0x9e3779b97f4a7c15ull + uint64_t(c.comm->rank());
      long samples = 0;
      const auto t0 = Clock::now();
      do {  // random windows, as the shuffled loader reads them
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ds.Read((x >> 11) % (ds.size() - window), window, buf.data());
        ++samples;
      } while (Since(t0) < (c.quick ? 0.2 : 1.0));
      local = double(samples) * c.seq / Since(t0);
    } catch (const std::exception& e) {
      error = e.what();
      local = -1;
    }
  }
  const auto all = Gather(*c.comm, local);
  if (c.data_path.empty()) {
    row.verdict = "skip";
    row.measured = "-";
    row.reason = "no dataset (give --data or a config with [data] train)";
    return row;
  }
  const double least = *std::min_element(all.begin(), all.end());
  row.data = {{"tokens_per_s_per_rank", all}, {"consumed_tokens_per_s", consume}};
  if (least < 0) {
    row.verdict = "no-go";
    row.measured = "failed";
    row.reason = error.empty() ? "a rank could not read the dataset" : error;
    return row;
  }
  row.measured = Fmt("%.4g tokens/s per rank (one thread, random windows, slowest rank)", least);
  if (least < consume) {
    row.verdict = "no-go";
    row.reason = "the data path cannot feed the step";
  } else if (least < 2 * consume) {
    row.verdict = "warn";
    row.reason = "less than 2x headroom over what the step consumes";
  }
  return row;
}

Row CheckAllReduce(Context& c) {
  Row row{"all-reduce", "", "", "go", ""};
  const int n = c.comm->size();
  if (n == 1) {
    row.verdict = "skip";
    row.measured = "-";
    row.expected = "-";
    row.reason = "1 rank (run under mpirun -np N to measure)";
    return row;
  }
  const size_t floats = size_t(std::min(c.bucket_bytes, c.quick ? 4.0 * (1 << 20) : 1e12) / 4);
  std::vector<float> buf(floats, 1.0f), err(floats, 0.0f);
  const int reps = c.quick ? 3 : 10;
  // The slowest rank's seconds per sum of the bucket in `wire`, encoding and decoding included,
  // after two to warm up the links.
  auto timed = [&](parallel::GradWire wire) {
    auto sum = [&] {
      std::fill(buf.begin(), buf.end(), 1.0f);
      (void)parallel::AllReduceOnWire(*c.comm, wire, buf.data(), floats, err.data())->Wait(-1);
    };
    sum();
    sum();
    c.comm->Barrier();
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) sum();
    return c.comm->AllReduceMax(Since(t0) / reps);
  };
  const double t = timed(parallel::GradWire::kF32);
  // Bus bandwidth: what each rank sends in a ring all-reduce, 2(n-1)/n of the buffer.
  const double bus = 2.0 * (n - 1) / n * double(floats) * 4 / t;
  // [parallel] grad_comm: the same bucket summed as the run will sum it.
  const parallel::GradWire wire = c.tiers.grad_comm;
  const double wire_t = wire == parallel::GradWire::kF32 ? t : timed(wire);
  // The share of a step: all gradients at that rate, against the measured step times the
  // micro-batches per rank (or the matmul rate, if the step failed).
  const plan::ModelSpec spec = Spec(c);
  const double params = plan::TotalParams(spec);
  const double ar_s = params / double(floats) * wire_t;
  const double tokens = double(c.global_batch) / n * c.seq;
  const double compute_s =
      c.step_s > 0
          ? tokens / (double(c.micro_batch) * c.seq) * c.step_s
          : tokens * plan::HardwareFlopsPerToken(spec, params, PlanRecompute(c.recompute)) /
                std::max(c.matmul_flops, 1.0);
  const double share = ar_s / (ar_s + compute_s);
  row.measured = Fmt("%.4g GB/s bus bandwidth (%.4g MB bucket, %.0f ranks)", bus / 1e9,
                     double(floats) * 4 / 1e6, double(n));
  row.expected = Fmt("gradients %.3g s of a %.3g s step (%.0f%%, before overlap)", ar_s,
                     ar_s + compute_s, 100 * share);
  if (wire != parallel::GradWire::kF32)  // the bucket's time in the wire format against fp32's
    row.expected +=
        std::string("; ") + parallel::GradWireName(wire) + Fmt(" %.2gx fp32", wire_t / t);
  row.data = {{"bus_bytes_per_s", bus},
              {"allreduce_s", ar_s},
              {"share_of_step", share},
              {"grad_comm", parallel::GradWireName(wire)},
              {"wire_time_ratio", wire_t / t}};
  if (share > 0.5) {
    row.verdict = "warn";
    row.reason = "gradient all-reduce is more than half the step";
  }
  return row;
}

}  // namespace keel::cli::preflight
