// One thread per connection; the store is a map under one mutex, held only for bookkeeping: a GET
// copies out of an item it holds by shared_ptr, and the spill folder's writes and removals happen
// outside it, so neither a slow reader nor the disk stalls a PUT of the next save.
//
// A PUT receives into the bytes of the step it is about to retire when it can (Store::Recycle):
// fresh memory for every copy cost more CPU than the transfer itself (the kernel zeroing the pages
// as they fault in: 55% of a 700 MB copy's CPU on a 2-core host), CPU the trainer's step beside it
// pays for.
#include "keel/ckpt/peer_holder.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "keel/ckpt/manifest.h"
#include "keel/ckpt/peer_client.h"
#include "keel/ckpt/peer_socket.h"
#include "keel/ckpt/peer_spill.h"
#include "keel/core/error.h"

namespace keel::ckpt::peer {
namespace {

struct Held {
  std::string bytes;  // not const: Store::Recycle moves them out of a retired step
  uint64_t xxh3 = 0;
  bool from_disk = false;  // loaded from the spill folder when the holder started
};

// Step -1: a name not of the "RUN/step_N/FILE" form, kept as it is (no retention).
using KeyParts = Key;
KeyParts Split(const std::string& key) { return ParseKey(key).value_or(Key{}); }

// A key a client may use: "RUN/step_N/FILE" and the like, never a path out of the spill folder.
bool SafeKey(const std::string& k) {
  if (k.size() > 512 || k.find("..") != std::string::npos || (!k.empty() && k[0] == '/'))
    return false;
  for (char c : k)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '/' &&
        c != '-')
      return false;
  return true;
}

template <class T>
bool ParseNumber(const std::string& s, T* v) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && end == s.data() + s.size();
}

class Store {
 public:
  explicit Store(const HolderOptions& o) : o_(o) {
    if (o.spill_dir.empty()) return;
    spill_ = std::make_unique<Spill>(o.spill_dir);
    int n = 0;
    std::vector<std::string> dropped;
    for (SpilledItem& s : spill_->Load()) {
      auto h = std::make_shared<Held>();
      h->bytes = std::move(s.bytes);
      h->xxh3 = s.xxh3;
      h->from_disk = true;
      const auto it = items_.find(s.key);
      total_ += h->bytes.size() - (it == items_.end() ? 0 : it->second->bytes.size());
      items_[s.key] = std::move(h);
      Retain(Split(s.key), &dropped);
      ++n;
    }
    Unspill(dropped);
    if (n > 0) std::printf("keel holder: %d cop(ies) found in %s\n", n, o.spill_dir.c_str());
  }

  // Before an item's bytes are received: "OK" and `n` bytes counted against the cap, or why not.
  // A step older than one this holder keeps of the same file is refused: the newer one belongs to
  // a timeline a restart left behind, and the sender trims it when its copy fails.
  std::string Reserve(const std::string& key, uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    const KeyParts k = Split(key);
    uint64_t freed = 0;
    std::set<int64_t> steps = {k.step};
    for (const auto& [other, h] : items_) {
      const KeyParts p = Split(other);
      if (k.step < 0 || p.run != k.run || p.file != k.file) continue;
      if (p.step > k.step)
        return "ERR " + key + ": this holder keeps step " + std::to_string(p.step) +
               " of the file, newer than this one (a timeline a restart left behind)";
      steps.insert(p.step);
    }
    // What retention drops once this one is in: the same key's old bytes, the oldest steps.
    for (const auto& [other, h] : items_) {
      const KeyParts p = Split(other);
      const bool old_step = k.step >= 0 && p.run == k.run && p.file == k.file &&
                            int(steps.size()) > o_.keep &&
                            p.step < *std::next(steps.rbegin(), o_.keep - 1);
      if (other == key || old_step) freed += h->bytes.size();
    }
    if (o_.max_bytes > 0 && total_ + reserved_ + n > o_.max_bytes + freed)
      return "ERR full: holds " + std::to_string(total_ + reserved_) + " of its " +
             std::to_string(o_.max_bytes) + " bytes";
    reserved_ += n;
    return "OK";
  }
  void Unreserve(uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ -= n;
  }

  // The reserved item, received whole and checked.
  void Put(const std::string& key, const std::shared_ptr<const Held>& h) {
    std::vector<std::string> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reserved_ -= h->bytes.size();
      auto it = items_.find(key);
      total_ -= it == items_.end() ? 0 : it->second->bytes.size();
      total_ += h->bytes.size();
      items_[key] = h;
      Retain(Split(key), &dropped);
    }
    Unspill(dropped);
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

  // A buffer of `n` bytes for the item `key` about to arrive: the bytes of the oldest kept step of
  // its run and file, which retention drops once the new one is in, if they are `n` bytes and no
  // GET is reading them; else empty. That step leaves the store now, so that during the transfer
  // the holder keeps two copies of the file rather than three; the newer kept step stays whole,
  // which is what `keep` is for (a transfer cut off loses the retired step a moment early).
  std::string Recycle(const std::string& key, uint64_t n) {
    const KeyParts k = Split(key);
    if (k.step < 0) return {};
    std::string bytes;
    std::vector<std::string> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::map<int64_t, decltype(items_)::iterator> steps;
      for (auto it = items_.begin(); it != items_.end(); ++it) {
        const KeyParts p = Split(it->first);
        if (p.run == k.run && p.file == k.file && p.step != k.step) steps.emplace(p.step, it);
      }
      // With one step kept, the retired step is the only whole copy: never taken early.
      if (o_.keep < 2 || int(steps.size()) < o_.keep) return {};
      const auto oldest = steps.begin()->second;
      // The map's pointer is the only one: Find hands out copies under mu_, so none is in use.
      if (oldest->second.use_count() != 1 || oldest->second->bytes.size() != n) return {};
      bytes = std::move(std::const_pointer_cast<Held>(oldest->second)->bytes);
      total_ -= n;
      dropped.push_back(oldest->first);
      items_.erase(oldest);
    }
    Unspill(dropped);
    return bytes;
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
    std::vector<std::string> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Erase([&](const KeyParts& k) { return k.run == run && k.step > max_step; }, &dropped);
    }
    Unspill(dropped);
    return int(dropped.size());
  }

 private:
  // Of `k`'s run and file, only the newest o_.keep steps stay.
  void Retain(const KeyParts& k, std::vector<std::string>* dropped) {
    if (k.step < 0) return;
    std::set<int64_t> steps;
    for (const auto& [key, h] : items_) {
      const KeyParts p = Split(key);
      if (p.run == k.run && p.file == k.file) steps.insert(p.step);
    }
    if (int(steps.size()) <= o_.keep) return;
    const int64_t oldest_kept = *std::next(steps.rbegin(), o_.keep - 1);
    Erase(
        [&](const KeyParts& p) {
          return p.run == k.run && p.file == k.file && p.step < oldest_kept;
        },
        dropped);
  }
  template <class F>
  void Erase(F drop, std::vector<std::string>* dropped) {
    for (auto it = items_.begin(); it != items_.end();) {
      if (drop(Split(it->first))) {
        total_ -= it->second->bytes.size();
        dropped->push_back(it->first);
        it = items_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Outside mu_: a spill write of gigabytes holds the spill folder's lock, and the store must go
  // on answering meanwhile.
  void Unspill(const std::vector<std::string>& keys) {
    if (spill_)
      for (const std::string& k : keys) spill_->Remove(k);
  }

  const HolderOptions o_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const Held>> items_;
  uint64_t total_ = 0, reserved_ = 0;
  std::unique_ptr<Spill> spill_;
};

// Takes an item's `n` bytes from `read(dst, offset, bytes)`, a slice at a time in order, into the
// store, and checks them against the xxh3 that `sent_hash()` gives once they are in; answers on
// `s`. The item has its `n` bytes reserved.
void Receive(Store& store, Socket& s, const std::string& key, uint64_t n,
             const std::function<void(char*, uint64_t, size_t)>& read,
             const std::function<std::string()>& sent_hash) {
  std::shared_ptr<Held> h;
  std::string hex;
  try {
    h = std::make_shared<Held>();
    h->bytes = store.Recycle(key, n);
    h->bytes.resize(n);
    // Hashed a slice at a time as it arrives, while the slice is still in cache.
    HashStream hash;
    constexpr uint64_t kSlice = uint64_t(4) << 20;
    for (uint64_t done = 0; done < n;) {
      const size_t k = size_t(std::min(kSlice, n - done));
      read(h->bytes.data() + done, done, k);
      hash.Update(h->bytes.data() + done, k);
      done += k;
    }
    h->xxh3 = hash.Digest();
    hex = sent_hash();
  } catch (...) {
    store.Unreserve(n);
    throw;
  }
  if (HashHex(h->xxh3) != hex) {
    store.Unreserve(n);
    s.SendLine("ERR " + key + ": xxh3 " + HashHex(h->xxh3) + " of the bytes received, the sender " +
               "says " + hex + " (corrupted in transit)");
    return;
  }
  store.Put(key, h);
  s.SendLine("OK");
  store.SpillItem(key, h);
}

std::string Admit(Store& store, const std::string& key, uint64_t n) {
  return SafeKey(key) ? store.Reserve(key, n) : "ERR \"" + key + "\": not a key";
}

// A PUT's `n` bytes (after its header) and the xxh3 line that follows them.
void ServePut(Store& store, Socket& s, const std::string& key, uint64_t n) {
  const std::string refused = Admit(store, key, n);
  if (refused != "OK") {
    // The sender does not wait for a reply before its bytes: take them, so that it reads the
    // reason rather than a reset connection.
    std::vector<char> sink(size_t(1) << 20);
    for (uint64_t left = n; left > 0;) {
      const size_t k = size_t(std::min<uint64_t>(left, sink.size()));
      s.RecvAll(sink.data(), k);
      left -= k;
    }
    s.RecvLine();
    s.SendLine(refused);
    return;
  }
  Receive(
      store, s, key, n, [&](char* dst, uint64_t, size_t k) { s.RecvAll(dst, k); },
      [&] { return s.RecvLine(); });
}

// A PUTFD from a rank of this host (Client::PutLocal): the bytes [at, at + n) of the descriptor
// that came with the request, read here; what the sender says their xxh3 is.
void ServePutFd(Store& store, Socket& s, const std::string& key, uint64_t at, uint64_t n,
                const std::string& hex) {
  struct Fd {
    int fd;
    ~Fd() {
      if (fd >= 0) ::close(fd);  // the sender's memory, held no longer than the copy
    }
  } f{s.TakeFd()};
  if (f.fd < 0) return s.SendLine("ERR PUTFD " + key + ": no descriptor came with it");
  const std::string refused = Admit(store, key, n);
  if (refused != "OK") return s.SendLine(refused);
  Receive(
      store, s, key, n,
      [&](char* dst, uint64_t off, size_t k) {
        for (size_t got = 0; got < k;) {
          const ssize_t r = ::pread(f.fd, dst + got, k - got, off_t(at + off + got));
          if (r < 0 && errno == EINTR) continue;
          if (r <= 0)
            throw Error(ExitCode::kRuntime,
                        key + ": the sender's descriptor " +
                            (r < 0 ? std::string("cannot be read: ") + std::strerror(errno)
                                   : "ends before the bytes it was to hold"));
          got += size_t(r);
        }
      },
      [&] { return hex; });
}

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
      std::string verb, key, a, b, c;
      in >> verb >> key >> a >> b >> c;
      uint64_t x = 0, y = 0;
      int64_t step = 0;
      if (verb == "PUT") {
        // A length that does not parse leaves the rest of the stream meaningless: close.
        if (!ParseNumber(a, &x) || x > (uint64_t(1) << 42))
          return s.SendLine("ERR PUT " + key + ": length \"" + a + "\" is not a byte count");
        ServePut(store, s, key, x);
      } else if (verb == "PUTFD") {
        if (!ParseNumber(a, &x) || !ParseNumber(b, &y) || y > (uint64_t(1) << 42))
          return s.SendLine("ERR PUTFD " + key + ": expected an offset and a byte count");
        ServePutFd(store, s, key, x, y, c);
      } else if (verb == "GET") {
        const auto h = ParseNumber(a, &x) && ParseNumber(b, &y) ? store.Find(key) : nullptr;
        if (!h) {
          s.SendLine("ERR " + key + ": not held");
        } else if (x + y > h->bytes.size() || x + y < x) {
          s.SendLine("ERR " + key + ": bytes [" + std::to_string(x) + ", " + std::to_string(x + y) +
                     ") past its " + std::to_string(h->bytes.size()));
        } else {
          s.SendLine("OK " + std::to_string(y));
          s.SendAll(h->bytes.data() + x, y);
        }
      } else if (verb == "LIST") {
        const std::string reply = store.List(key);
        s.SendAll(reply.data(), reply.size());
      } else if (verb == "TRIM") {
        if (!ParseNumber(a, &step))
          s.SendLine("ERR TRIM " + key + ": step \"" + a + "\" is not a number");
        else
          s.SendLine("OK " + std::to_string(store.Trim(key, step)));
      } else if (verb == "QUIT") {
        s.SendLine("OK");
        quit = true;
        return;
      } else {
        s.SendLine("ERR unknown request \"" + verb +
                   "\" (expected PUT, PUTFD, GET, LIST, TRIM or QUIT)");
        return;
      }
    }
  } catch (const std::exception& e) {
    // A client that vanished mid-transfer, or an item this host has no memory or disk for: what
    // it sent is dropped, nothing held changes, and the holder goes on serving the others.
    try {
      s.SendLine(std::string("ERR ") + e.what());
    } catch (const std::exception&) {
    }
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
  // Ranks of this host hand their copies over here without a socket carrying the bytes.
  const int local = ListenLocal(bound);
  if (on_listening) on_listening(ntohs(bound.sin_port));
  auto store = std::make_shared<Store>(o);
  auto quit = std::make_shared<std::atomic<bool>>(false);
  while (!stop.load() && !quit->load()) {
    pollfd p[2] = {{fd, POLLIN, 0}, {local, POLLIN, 0}};
    if (::poll(p, local >= 0 ? 2 : 1, 200) <= 0) continue;
    const bool tcp = p[0].revents & POLLIN;
    const int c = ::accept4(tcp ? fd : local, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      ::usleep(100000);  // out of descriptors (EMFILE): let connections end rather than spin
      continue;
    }
    // A GET's reply is a line then the bytes: with Nagle's algorithm the second write waits for
    // the ACK of the first, which a reader kept on the connection delays by up to 40 ms (a restore
    // of GPT-2 124M's 450 pieces took 14 s instead of 2).
    const int one = 1;
    if (tcp) ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::thread([store, quit, c, tcp] {
      Serve(*store, Socket(c, tcp ? "client" : "local client"), *quit);
    }).detach();
  }
  if (local >= 0) ::close(local);
  ::close(fd);
}

}  // namespace keel::ckpt::peer
