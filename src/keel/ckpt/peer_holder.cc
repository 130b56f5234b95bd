// One thread per connection; the store is a map under one mutex, and a GET copies out of an item
// it holds by shared_ptr, so a slow reader never blocks a PUT of the next save.
#include "keel/ckpt/peer_holder.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "keel/ckpt/checkpoint_dir.h"
#include "keel/ckpt/manifest.h"
#include "keel/ckpt/peer_socket.h"
#include "keel/ckpt/peer_spill.h"
#include "keel/core/error.h"

namespace keel::ckpt::peer {
namespace {

struct Held {
  std::string bytes;
  uint64_t xxh3 = 0;
  bool from_disk = false;  // loaded from the spill folder when the holder started
};

// "RUN/step_N/FILE" → {RUN, N, FILE}; step -1 when the key is not of that form (kept as is).
struct KeyParts {
  std::string run, file;
  int64_t step = -1;
};
KeyParts Split(const std::string& key) {
  KeyParts k;
  const size_t a = key.find('/'), b = a == std::string::npos ? a : key.find('/', a + 1);
  if (b == std::string::npos) return k;
  const auto step = ParseStepDirName(key.substr(a + 1, b - a - 1));
  if (!step) return k;
  k.run = key.substr(0, a);
  k.file = key.substr(b + 1);
  k.step = *step;
  return k;
}

class Store {
 public:
  explicit Store(const HolderOptions& o) : o_(o) {
    if (o.spill_dir.empty()) return;
    spill_ = std::make_unique<Spill>(o.spill_dir);
    int n = 0;
    for (SpilledItem& s : spill_->Load()) {
      auto h = std::make_shared<Held>();
      h->bytes = std::move(s.bytes);
      h->xxh3 = s.xxh3;
      h->from_disk = true;
      total_ += h->bytes.size();
      items_[s.key] = std::move(h);
      Retain(Split(s.key));
      ++n;
    }
    if (n > 0) std::printf("keel holder: %d cop(ies) found in %s\n", n, o.spill_dir.c_str());
  }

  // After a PUT was answered: the item to the spill folder too, if it is still the one held.
  void SpillItem(const std::string& key, const std::shared_ptr<const Held>& h) {
    if (!spill_) return;
    spill_->Write(key, h->bytes, h->xxh3);
    std::shared_ptr<const Held> now;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = items_.find(key);
      if (it != items_.end()) now = it->second;
    }
    if (!now)
      spill_->Remove(key);  // dropped meanwhile (retention, a trim)
    else if (now != h)
      spill_->Write(key, now->bytes, now->xxh3);  // replaced meanwhile: the newer one stays
  }

  std::string Put(const std::string& key, std::shared_ptr<const Held> h) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = items_.find(key);
    const uint64_t old = it == items_.end() ? 0 : it->second->bytes.size();
    if (o_.max_bytes > 0 && total_ - old + h->bytes.size() > o_.max_bytes)
      return "ERR full: holds " + std::to_string(total_) + " of its " +
             std::to_string(o_.max_bytes) + " bytes";
    total_ += h->bytes.size() - old;
    items_[key] = std::move(h);
    Retain(Split(key));
    return "OK";
  }

  std::shared_ptr<const Held> Find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = items_.find(key);
    return it == items_.end() ? nullptr : it->second;
  }

  std::string List(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mu_);
    std::ostringstream body;
    int n = 0;
    for (auto it = items_.lower_bound(prefix);
         it != items_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it, ++n)
      body << it->first << " " << it->second->bytes.size() << " " << HashHex(it->second->xxh3)
           << (it->second->from_disk ? " disk" : " memory") << "\n";
    return "OK " + std::to_string(n) + "\n" + body.str();
  }

  int Trim(const std::string& run, int64_t max_step) {
    std::lock_guard<std::mutex> lock(mu_);
    return Erase([&](const KeyParts& k) { return k.run == run && k.step > max_step; });
  }

 private:
  // Of `k`'s run and file, only the newest o_.keep steps stay.
  void Retain(const KeyParts& k) {
    if (k.step < 0) return;
    std::set<int64_t> steps;
    for (const auto& [key, h] : items_) {
      const KeyParts p = Split(key);
      if (p.run == k.run && p.file == k.file) steps.insert(p.step);
    }
    if (int(steps.size()) <= o_.keep) return;
    const int64_t oldest_kept = *std::next(steps.rbegin(), o_.keep - 1);
    Erase([&](const KeyParts& p) {
      return p.run == k.run && p.file == k.file && p.step < oldest_kept;
    });
  }
  template <class F>
  int Erase(F drop) {
    int n = 0;
    for (auto it = items_.begin(); it != items_.end();) {
      if (drop(Split(it->first))) {
        total_ -= it->second->bytes.size();
        if (spill_) spill_->Remove(it->first);
        it = items_.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    return n;
  }

  const HolderOptions o_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const Held>> items_;
  uint64_t total_ = 0;
  std::unique_ptr<Spill> spill_;
};

void Serve(Store& store, Socket s, std::atomic<bool>& quit) {
  s.SetTimeout(60);
  try {
    for (;;) {
      std::string line;
      try {
        line = s.RecvLine();
      } catch (const Error&) {
        return;  // the client closed the connection
      }
      std::istringstream in(line);
      std::string verb, key;
      in >> verb >> key;
      if (verb == "PUT") {
        uint64_t n = 0;
        std::string hex;
        in >> n >> hex;
        auto h = std::make_shared<Held>();
        h->bytes.resize(n);
        s.RecvAll(h->bytes.data(), n);
        h->xxh3 = Hash(h->bytes.data(), n);
        if (HashHex(h->xxh3) != hex) {
          s.SendLine("ERR " + key + ": xxh3 " + HashHex(h->xxh3) +
                     " of the bytes received, the "
                     "sender says " +
                     hex + " (corrupted in transit)");
          continue;
        }
        const std::string reply = store.Put(key, h);
        s.SendLine(reply);
        if (reply == "OK") store.SpillItem(key, h);
      } else if (verb == "GET") {
        uint64_t off = 0, n = 0;
        in >> off >> n;
        const auto h = store.Find(key);
        if (!h) {
          s.SendLine("ERR " + key + ": not held");
        } else if (off + n > h->bytes.size() || off + n < off) {
          s.SendLine("ERR " + key + ": bytes [" + std::to_string(off) + ", " +
                     std::to_string(off + n) + ") past its " + std::to_string(h->bytes.size()));
        } else {
          s.SendLine("OK " + std::to_string(n));
          s.SendAll(h->bytes.data() + off, n);
        }
      } else if (verb == "LIST") {
        const std::string reply = store.List(key);
        s.SendAll(reply.data(), reply.size());
      } else if (verb == "TRIM") {
        int64_t max_step = 0;
        in >> max_step;
        s.SendLine("OK " + std::to_string(store.Trim(key, max_step)));
      } else if (verb == "QUIT") {
        s.SendLine("OK");
        quit = true;
        return;
      } else {
        s.SendLine("ERR unknown request \"" + verb + "\" (expected PUT, GET, LIST, TRIM or QUIT)");
        return;
      }
    }
  } catch (const Error&) {
    // A client that vanished mid-transfer: what it sent is dropped, nothing else changes.
  }
}

}  // namespace

void RunHolder(const HolderOptions& o, const std::atomic<bool>& stop,
               const std::function<void(int port)>& on_listening) {
  // A holder that was asked to quit may still hold the port for a moment.
  int fd = -1;
  for (int tries = 0; fd < 0; ++tries) {
    try {
      fd = Listen(o.bind, o.port);
    } catch (const Error&) {
      if (tries >= 50) throw;
      ::usleep(200000);
    }
  }
  sockaddr_in bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  if (on_listening) on_listening(ntohs(bound.sin_port));
  auto store = std::make_shared<Store>(o);
  auto quit = std::make_shared<std::atomic<bool>>(false);
  while (!stop.load() && !quit->load()) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    const int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    std::thread([store, quit, c] { Serve(*store, Socket(c, "client"), *quit); }).detach();
  }
  ::close(fd);
}

}  // namespace keel::ckpt::peer
