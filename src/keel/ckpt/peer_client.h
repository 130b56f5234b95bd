// Tier-0 checkpoints: the client side of a holder (peer_holder.h), a process per host that keeps
// ranks' checkpoint files in its memory and outlives the trainer. Items are named
// "RUN/step_NNNNNNNN/FILE" (FILE: rank_RRRRR.bin, its sidecar rank_RRRRR.json, or rank 0's
// manifest.json without pieces); the holder keeps the newest two steps of each RUN and FILE.
//
//   peer::Client c({"node2", 29790});
//   c.Put("3f2a.../step_00000012/rank_00002.bin", bytes, n);
//   for (const peer::Item& i : c.List("3f2a.../")) ...
//   c.Get("3f2a.../step_00000012/rank_00002.bin", offset, n, dst);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace keel::ckpt::peer {

struct Address {
  std::string host;
  int port = 0;
  std::string Name() const { return host + ":" + std::to_string(port); }
};

// "h1:29790,h2:29790" in order. Throws keel::Error (bad input) naming `what` and the entry.
std::vector<Address> ParseAddresses(const std::string& list, const std::string& what);

// An item's name in a holder: "RUN/step_NNNNNNNN/FILE".
struct Key {
  std::string run;
  int64_t step = -1;
  std::string file;
  std::string str() const;
};
// nullopt for a name of another form.
std::optional<Key> ParseKey(const std::string& name);

struct Item {
  std::string key;
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
  bool from_disk = false;  // the holder found it in its spill folder at start (peer_spill.h)
};

class Socket;

// One request per connection; each throws keel::Error (runtime) naming the holder when it is
// unreachable, times out, or answers with an error.
class Client {
 public:
  explicit Client(Address a, double timeout_s = 10) : a_(std::move(a)), timeout_s_(timeout_s) {}
  // Stores `n` bytes under `key`, replacing what was there once all of them arrived and their xxh3
  // matched (hashed a slice at a time as they go, and sent after them). `rate_mbit` > 0 paces the
  // send to that rate (so that it yields the link to gradient traffic). `each_slice(offset, bytes)`
  // sees each slice just before it goes, while it is in cache: the writer hashes its pieces there
  // rather than in passes of their own over the copy. A caller that knows the bytes' xxh3 passes
  // it and they are not hashed again (the holder checks it all the same). Returns the xxh3 sent.
  uint64_t Put(const std::string& key, const void* data, size_t n, double rate_mbit = 0,
               const std::function<void(size_t offset, size_t bytes)>& each_slice = {},
               std::optional<uint64_t> xxh3 = std::nullopt) const;
  // The same item handed to the holder of this client's address when it runs on this host: the
  // bytes [offset, offset + n) of the file `fd` (a memfd), with their xxh3, which the holder reads
  // and checks itself. No socket carries the bytes (a loopback send costs two kernel copies and
  // their CPU, beside the step). False when that holder is not on this host or takes no
  // descriptors (then Put); throws as Put when the holder refuses the item.
  bool PutLocal(const std::string& key, int fd, uint64_t offset, uint64_t n, uint64_t xxh3) const;
  std::vector<Item> List(const std::string& prefix) const;
  void Get(const std::string& key, uint64_t offset, uint64_t n, void* dst) const;
  // Drops the items of `run` whose step is above `max_step` (a timeline a restart left behind).
  int Trim(const std::string& run, int64_t max_step) const;
  // Asks the holder to exit (what it holds is dropped).
  void Quit() const;
  const Address& address() const { return a_; }
  // Whether the holder's address is one of this host's (PutLocal may hand items over).
  bool local() const;

 private:
  Address a_;
  double timeout_s_;
};

// GETs over one connection kept open: a restore reads its files a piece at a time, and a
// connection (and a holder thread) per piece cost 40% of it (700 MB in 450 pieces over loopback:
// 430-450 ms, 260 ms over one connection). A kept connection that
// fails (the holder closes one idle for a minute) is tried once more on a fresh one. One thread
// at a time.
class Reader {
 public:
  explicit Reader(Address a, double timeout_s = 10);
  ~Reader();
  Reader(Reader&&) noexcept;
  void Get(const std::string& key, uint64_t offset, uint64_t n, void* dst);

 private:
  Address a_;
  double timeout_s_;
  std::unique_ptr<Socket> s_;
};

}  // namespace keel::ckpt::peer
