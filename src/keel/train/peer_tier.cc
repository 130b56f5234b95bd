#include "keel/train/peer_tier.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>

#include "keel/ckpt/checkpoint_dir.h"
#include "keel/ckpt/manifest_build.h"
#include "keel/core/error.h"
#include "keel/core/host.h"
#include "keel/train/saved_layout.h"

namespace keel::train {
namespace {

using ckpt::RankFile;
using ckpt::peer::Address;
using ckpt::peer::Client;
using ckpt::peer::Item;
using ckpt::peer::Reader;

std::string Short(const std::string& h) { return h.substr(0, h.find('.')); }

bool IsAddress(const std::string& h) {
  in_addr a{};
  return ::inet_pton(AF_INET, h.c_str(), &a) == 1;
}

// This host's place in `ring`: its name (whole, else the part before the first dot when only one
// entry has it), else an entry that resolves to one of this host's addresses (hostfiles that list
// addresses). -1 if none.
int ThisHostIn(const std::vector<Address>& ring) {
  const std::string name = HostName();
  int shorts = 0, by_short = -1;
  for (size_t i = 0; i < ring.size(); ++i) {
    if (ring[i].host == name) return int(i);
    if (!IsAddress(ring[i].host) && Short(ring[i].host) == Short(name)) ++shorts, by_short = int(i);
  }
  if (shorts == 1) return by_short;
  std::set<uint32_t> mine;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i; i = i->ifa_next)
      if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET)
        mine.insert(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
    ::freeifaddrs(ifs);
  }
  for (size_t i = 0; i < ring.size(); ++i) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    if (::getaddrinfo(ring[i].host.c_str(), nullptr, &hints, &res) != 0) continue;
    bool here = false;
    for (addrinfo* r = res; r && !here; r = r->ai_next)
      here = mine.count(reinterpret_cast<sockaddr_in*>(r->ai_addr)->sin_addr.s_addr) > 0;
    ::freeaddrinfo(res);
    // Loopback names every host: only a ring of one may be found by it.
    if (here && (ring.size() == 1 || !IsAddress(ring[i].host) || ring[i].host.rfind("127.", 0)))
      return int(i);
  }
  return -1;
}

// Every reachable holder's items of the run, by step and file: the holders (ring indexes) that
// keep each, and its size.
struct Copies {
  std::vector<int> holders;
  uint64_t bytes = 0;
};
using Where = std::map<int64_t, std::map<std::string, Copies>>;
// (step, file, holder) of the copies a holder found on its host's disk when it started.
using OnDisk = std::set<std::tuple<int64_t, std::string, int>>;
Where Inventory(const PeerTier& t, OnDisk* disk = nullptr) {
  Where w;
  for (int h = 0; h < int(t.ring.size()); ++h) {
    std::vector<Item> items;
    try {
      items = Client(t.ring[size_t(h)], 5).List(t.run + "/");
    } catch (const Error&) {
      continue;  // a host that is gone took its copies with it
    }
    for (const Item& i : items) {
      const std::optional<ckpt::peer::Key> k = ckpt::peer::ParseKey(i.key);
      if (!k) continue;
      Copies& c = w[k->step][k->file];
      c.holders.push_back(h);
      c.bytes = i.bytes;
      if (disk && i.from_disk) disk->insert({k->step, k->file, h});
    }
  }
  return w;
}

// The holders of a file in the order a rank of host `self` reads them: the holder `first` (the
// writer's host's, the copy that is there unless that host was lost), then by distance along the
// ring from this host (its own first).
std::vector<int> Preferred(std::vector<int> holders, int self, int n, int first = -1) {
  auto order = [&](int h) { return h == first ? -1 : (h - self + n) % n; };
  std::sort(holders.begin(), holders.end(), [&](int a, int b) { return order(a) < order(b); });
  return holders;
}

// A small item whole (a manifest, a sidecar), from the first holder that gives it.
std::string Fetch(const PeerTier& t, const Copies& copies, const std::string& key) {
  std::string last;
  for (int h : Preferred(copies.holders, t.self, int(t.ring.size()))) {
    try {
      std::string bytes(copies.bytes, '\0');
      Client(t.ring[size_t(h)], 10).Get(key, 0, copies.bytes, bytes.data());
      return bytes;
    } catch (const std::exception& e) {
      last = e.what();
    }
  }
  ThrowBadInput("tier-0 copy: " + key + ": no holder could give it (" + last + ")");
}

}  // namespace

ckpt::PeerTarget PeerTier::Target(double rate_mbit) const {
  ckpt::PeerTarget p;
  p.run = run;
  p.rate_mbit = rate_mbit;
  p.holders.push_back(ring[size_t(self)]);
  if (ring.size() > 1) p.holders.push_back(ring[size_t(self + 1) % ring.size()]);
  return p;
}

std::optional<PeerTier> PeerTierFromEnv(const std::string& run_dir) {
  const char* env = std::getenv(kPeerHoldersEnv);
  if (!env || !*env) return std::nullopt;
  PeerTier t;
  t.ring = ckpt::peer::ParseAddresses(env, std::string("$") + kPeerHoldersEnv);
  t.self = ThisHostIn(t.ring);
  // One host's run (the local launcher) names its holder by address, not by host name.
  if (t.self < 0 && t.ring.size() == 1) t.self = 0;
  if (t.self < 0)
    ThrowBadInput(std::string("$") + kPeerHoldersEnv + ": " + env + ": this host (" + HostName() +
                  ") is not in it, by name or by address");
  std::error_code ec;
  const auto abs = std::filesystem::weakly_canonical(run_dir, ec);
  const std::string path = ec ? run_dir : abs.string();
  t.run = ckpt::HashHex(ckpt::Hash(path.data(), path.size()));
  return t;
}

std::vector<int64_t> WholePeerCopies(const PeerTier& t) {
  std::vector<int64_t> out;
  const Where w = Inventory(t);
  for (auto it = w.rbegin(); it != w.rend(); ++it) {
    const auto manifest = it->second.find("manifest.json");
    if (manifest == it->second.end()) continue;
    const std::string prefix = ckpt::peer::Key{t.run, it->first, ""}.str();
    int world = 0;
    try {
      const std::string text = Fetch(t, manifest->second, prefix + "manifest.json");
      world = RanksThatSaved(ckpt::ManifestFromJsonText(text, prefix + "manifest.json").state);
    } catch (const std::exception&) {
      continue;  // not whole where it matters: another holder's copy, or the next step
    }
    bool whole = world > 0;
    for (int r = 0; r < world && whole; ++r)
      whole = it->second.count(RankFile(r, "bin")) && it->second.count(RankFile(r, "json"));
    if (whole) out.push_back(it->first);
  }
  return out;
}

ckpt::CheckpointReader OpenPeerCopy(const PeerTier& t, int64_t step, PeerRead* read) {
  OnDisk disk;
  const Where all = Inventory(t, &disk);
  const auto at = all.find(step);
  const std::string name = "peer:" + ckpt::StepDirName(step);
  if (at == all.end()) ThrowBadInput(name + ": no holder keeps it any more");
  const auto files = at->second;
  const std::string prefix = ckpt::peer::Key{t.run, step, ""}.str();  // + FILE
  auto holders_of = [&](const std::string& f) {
    const auto it = files.find(f);
    if (it == files.end()) ThrowBadInput(name + ": " + f + ": no holder keeps it");
    return it->second;
  };
  ckpt::Manifest m = ckpt::ManifestFromJsonText(
      Fetch(t, holders_of("manifest.json"), prefix + "manifest.json"), name + "/manifest.json");
  std::vector<std::pair<std::string, nlohmann::json>> sidecars;
  std::map<std::string, std::string> writer;  // file -> the host that wrote it
  for (int r = 0; r < RanksThatSaved(m.state); ++r) {
    const std::string side = RankFile(r, "json");
    const auto j = nlohmann::json::parse(Fetch(t, holders_of(side), prefix + side), nullptr, false);
    if (!j.is_object() || !j.contains("pieces") || !j["pieces"].is_array() || !j.contains("host") ||
        !j["host"].is_string())
      ThrowBadInput(name + "/" + side + ": expected {\"host\": ..., \"pieces\": [...]}");
    sidecars.emplace_back(name + "/" + side, j["pieces"]);
    writer[RankFile(r, "bin")] = j["host"];
  }
  ckpt::AddRankPieces(m, sidecars);
  // Which holder each file is read from, decided at its first piece and kept (a holder that
  // fails mid-way hands the file to the next).
  auto chosen = std::make_shared<std::map<std::string, int>>();
  auto mu = std::make_shared<std::mutex>();
  // A connection kept open per holder for the whole load (ckpt::peer::Reader).
  auto readers = std::make_shared<std::map<int, Reader>>();
  auto readers_mu = std::make_shared<std::mutex>();
  auto source = [t, files, prefix, name, chosen, mu, readers, readers_mu, read, writer, disk, step](
                    const std::string& file, uint64_t offset, uint64_t bytes, void* dst) {
    const auto it = files.find(file);
    if (it == files.end()) ThrowBadInput(name + "/" + file + ": no holder keeps it");
    const auto w = writer.find(file);
    int first = -1;
    for (int h = 0; h < int(t.ring.size()) && w != writer.end(); ++h)
      if (t.ring[size_t(h)].host == w->second) first = h;
    std::string last;
    for (int h : Preferred(it->second.holders, t.self, int(t.ring.size()), first)) {
      {
        std::lock_guard<std::mutex> lock(*mu);
        const auto c = chosen->find(file);
        if (c != chosen->end() && c->second != h) continue;
      }
      try {
        {
          std::lock_guard<std::mutex> lock(*readers_mu);
          readers->try_emplace(h, t.ring[size_t(h)], 10)
              .first->second.Get(prefix + file, offset, bytes, dst);
        }
        std::lock_guard<std::mutex> lock(*mu);
        if (chosen->emplace(file, h).second && read) {
          if (disk.count({step, file, h})) ++read->from_local_disk;
          if (h == first) {
            ++read->own_copies;
          } else {
            ++read->buddy_copies;
            read->buddy_files.push_back(file + " from " + t.ring[size_t(h)].host);
          }
        }
        return;
      } catch (const Error& e) {
        last = e.what();
        std::lock_guard<std::mutex> lock(*mu);
        chosen->erase(file);
      }
    }
    ThrowBadInput(name + "/" + file + ": no holder could give bytes [" + std::to_string(offset) +
                  ", " + std::to_string(offset + bytes) + ") (" + last + ")");
  };
  return ckpt::CheckpointReader::FromSource(name, std::move(m), source);
}

void TrimPeerCopies(const PeerTier& t, int64_t step) {
  for (const Address& a : t.ring) try {
      Client(a, 5).Trim(t.run, step);
    } catch (const Error&) {
    }
}

}  // namespace keel::train
