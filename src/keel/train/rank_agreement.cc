#include "keel/train/rank_agreement.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "keel/core/hex.h"
#include "keel/core/host.h"
#include "keel/data/dataset_meta.h"

namespace keel::train {
namespace {

// If a rank holds an error, every rank throws the lowest such rank's (see AgreeOnSetup), prefixed
// with "rank N on HOST: " when `name_rank` and N is not 0.
void ThrowLowest(parallel::Comm& comm, const std::optional<Error>& mine, bool name_rank) {
  const int world = comm.size(), rank = comm.rank();
  const double top = comm.AllReduceMax(mine ? double(world - rank) : 0.0);
  if (top == 0) return;
  const int root = world - int(top);
  std::string msg = rank == root ? std::string(mine->what()) : std::string();
  if (rank == root && root != 0 && name_rank) {
    // Where to look, on a cluster.
    msg = "rank " + std::to_string(root) + " on " + HostName() + ": " + msg;
  }
  int32_t code = rank == root ? int32_t(mine->code()) : 0;
  comm.Broadcast(&code, sizeof code, root);
  comm.BroadcastString(msg, root);
  // Rank 0 prints before any rank exits: mpirun ends the whole job at the first non-zero exit,
  // and a quiet rank that left first would cut rank 0 off before its line.
  if (rank == 0) std::fprintf(stderr, "keel: error: %s\n", msg.c_str());
  std::fflush(stderr);
  comm.Barrier();
  throw Error(ExitCode(code), msg, /*quiet=*/true);
}

std::string Hex(uint64_t h) { return HashHex(h); }

}  // namespace

Fingerprint ConfigFingerprint(const RunConfig& cfg) {
  Fingerprint fp;
  std::istringstream in(ToToml(cfg));
  std::string line, section;
  int array_entry = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind("[[", 0) == 0) {  // an array of tables: number its entries
      section = line.substr(2, line.find("]]") - 2) + "[" + std::to_string(array_entry++) + "]";
      continue;
    }
    if (line[0] == '[') {
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    const std::string key = section + "." + line.substr(0, eq);
    if (key == "data.train" || key == "data.val" || key == "model.init_from" ||
        (key.rfind("data.sources[", 0) == 0 && key.size() > 5 &&
         key.compare(key.size() - 5, 5, ".path") == 0))
      continue;  // paths: DataIdentity and InitIdentity stand for them
    std::string value = line.substr(eq + 3);
    // ToToml's comment after a value says where a default came from: "0 (from gpt2-tiny: 2)".
    if (const size_t c = value.find("  # "); c != std::string::npos)
      value = value.substr(0, c) + " (" + value.substr(c + 4) + ")";
    fp.emplace_back(key, value);
  }
  return fp;
}

std::string DataIdentity(const data::TokenDataset& ds, const std::string& path) {
  if (const data::DatasetMeta* m = ds.meta()) {
    std::string shards;
    for (const auto& s : m->shards) shards += s.xxh3 + s.index_xxh3;
    return std::to_string(m->tokens()) + " tokens, shards xxh3 " +
           Hex(XXH3_64bits(shards.data(), shards.size()));
  }
  return FileIdentity(path);
}

std::string FileIdentity(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) ThrowBadInput(path + ": cannot open to fingerprint it");
  const uint64_t size = uint64_t(in.tellg());
  constexpr uint64_t kWhole = uint64_t(256) << 20, kBlock = uint64_t(1) << 20, kBlocks = 64;
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(kBlock);
  auto hash_range = [&](uint64_t at, uint64_t n) {
    in.seekg(std::streamoff(at));
    while (n > 0) {
      const uint64_t k = std::min<uint64_t>(n, kBlock);
      in.read(buf.data(), std::streamsize(k));
      XXH3_64bits_update(st, buf.data(), size_t(in.gcount()));
      if (uint64_t(in.gcount()) != k) break;
      n -= k;
    }
  };
  if (size <= kWhole) {
    hash_range(0, size);
  } else {
    for (uint64_t i = 0; i < kBlocks; ++i) hash_range((size - kBlock) / (kBlocks - 1) * i, kBlock);
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return std::to_string(size) + " bytes, xxh3 " + Hex(h) + (size > kWhole ? " (sampled)" : "");
}

std::string InitIdentity(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return FileIdentity(path);
  std::vector<std::string> files;  // a Hugging Face folder: every file in it, by name
  for (const auto& e : fs::directory_iterator(path, ec))
    if (e.is_regular_file(ec)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  std::string all;
  for (const std::string& f : files) all += f + ": " + FileIdentity(path + "/" + f) + "\n";
  return std::to_string(files.size()) + " files, xxh3 " + Hex(XXH3_64bits(all.data(), all.size()));
}

void ShareError(parallel::Comm& comm, const std::optional<Error>& error) {
  if (comm.size() == 1) {
    if (error) throw *error;
    return;
  }
  ThrowLowest(comm, error, /*name_rank=*/true);
}

void AgreeOnSetup(parallel::Comm& comm, const std::optional<Error>& failed,
                  const Fingerprint& fingerprint) {
  ShareError(comm, failed);
  if (comm.size() == 1) return;
  // Rank 0's fingerprint to every rank; each names its first difference.
  std::string ref = comm.rank() == 0 ? nlohmann::json(fingerprint).dump() : std::string();
  comm.BroadcastString(ref, 0);
  const auto theirs = nlohmann::json::parse(ref).get<Fingerprint>();
  std::optional<std::string> differs;
  for (size_t i = 0; i < std::max(theirs.size(), fingerprint.size()) && !differs; ++i) {
    const bool have = i < fingerprint.size(), ref_has = i < theirs.size();
    if (have && ref_has && fingerprint[i] == theirs[i]) continue;
    const std::string key = have ? fingerprint[i].first : theirs[i].first;
    const std::string mine =
        have && (!ref_has || theirs[i].first == key) ? fingerprint[i].second : "(none)";
    const std::string ref_v = ref_has && theirs[i].first == key ? theirs[i].second : "(none)";
    differs =
        key + ": rank " + std::to_string(comm.rank()) + " has " + mine + ", rank 0 has " + ref_v;
  }
  const int n_differ = int(comm.AllReduceSum(differs ? 1.0 : 0.0));
  std::optional<Error> e;
  if (differs)
    e = Error(
        ExitCode::kBadInput,
        "the ranks disagree on " + *differs +
            (n_differ > 1 ? " (" + std::to_string(n_differ) + " ranks differ from rank 0)" : "") +
            "; every rank must run the same config, model, data and keel build");
  ThrowLowest(comm, e, /*name_rank=*/false);
}

}  // namespace keel::train
