#include "keel/ckpt/peer_client.h"

#include <charconv>
#include <chrono>
#include <sstream>
#include <thread>

#include "keel/ckpt/checkpoint_dir.h"
#include "keel/ckpt/manifest.h"
#include "keel/ckpt/peer_socket.h"
#include "keel/core/error.h"

namespace keel::ckpt::peer {
namespace {

int Count(const std::string& s, const Socket& from) {
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size())
    throw Error(ExitCode::kRuntime, "tier-0 holder " + from.peer() + ": expected a count, got \"" +
                                        s + "\" (not keel's holder?)");
  return v;
}

// "OK ..." → what follows; "ERR msg" → throws naming the holder.
std::string Expect(Socket& s, const std::string& request) {
  const std::string line = s.RecvLine();
  if (line.rfind("OK", 0) == 0) return line.size() > 3 ? line.substr(3) : "";
  throw Error(ExitCode::kRuntime, "tier-0 holder " + s.peer() + ": " + request + ": " +
                                      (line.rfind("ERR ", 0) == 0 ? line.substr(4) : line));
}

}  // namespace

std::string Key::str() const { return run + "/" + StepDirName(step) + "/" + file; }

std::optional<Key> ParseKey(const std::string& name) {
  const size_t a = name.find('/'), b = a == std::string::npos ? a : name.find('/', a + 1);
  if (b == std::string::npos) return std::nullopt;
  const auto step = ParseStepDirName(name.substr(a + 1, b - a - 1));
  if (!step) return std::nullopt;
  return Key{name.substr(0, a), *step, name.substr(b + 1)};
}

std::vector<Address> ParseAddresses(const std::string& list, const std::string& what) {
  std::vector<Address> out;
  std::istringstream in(list);
  for (std::string e; std::getline(in, e, ',');) {
    const size_t colon = e.rfind(':');
    int port = 0;
    try {
      port = colon == std::string::npos ? 0 : std::stoi(e.substr(colon + 1));
    } catch (const std::exception&) {
      port = 0;
    }
    if (colon == 0 || port <= 0 || port > 65535)
      ThrowBadInput(what + ": \"" + e + "\": expected HOST:PORT");
    out.push_back({e.substr(0, colon), port});
  }
  if (out.empty()) ThrowBadInput(what + ": empty: expected HOST:PORT[,HOST:PORT...]");
  return out;
}

uint64_t Client::Put(const std::string& key, const void* data, size_t n, double rate_mbit,
                     const std::function<void(size_t, size_t)>& each_slice,
                     std::optional<uint64_t> xxh3) const {
  Socket s = Socket::Connect(a_.host, a_.port, timeout_s_);
  s.SendLine("PUT " + key + " " + std::to_string(n));
  const auto* p = static_cast<const uint8_t*>(data);
  constexpr size_t kSlice = size_t(1) << 20;
  HashStream hash;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t done = 0; done < n;) {
    const size_t k = std::min(kSlice, n - done);
    if (each_slice) each_slice(done, k);
    if (!xxh3) hash.Update(p + done, k);
    s.SendAll(p + done, k);
    done += k;
    if (rate_mbit > 0)
      std::this_thread::sleep_until(
          t0 + std::chrono::duration<double>(double(done) * 8 / (rate_mbit * 1e6)));
  }
  if (!xxh3) xxh3 = hash.Digest();
  s.SendLine(HashHex(*xxh3));
  Expect(s, "PUT " + key);
  return *xxh3;
}

bool Client::local() const { return IsLocalAddress(a_.host); }

bool Client::PutLocal(const std::string& key, int fd, uint64_t offset, uint64_t n,
                      uint64_t xxh3) const {
  if (!local()) return false;
  Socket s;
  try {
    s = Socket::ConnectLocal(a_.host, a_.port, timeout_s_);
  } catch (const Error&) {
    return false;  // a holder of another build, or another process has the name
  }
  s.SendLineWithFd(
      "PUTFD " + key + " " + std::to_string(offset) + " " + std::to_string(n) + " " + HashHex(xxh3),
      fd);
  Expect(s, "PUT " + key);
  return true;
}

std::vector<Item> Client::List(const std::string& prefix) const {
  Socket s = Socket::Connect(a_.host, a_.port, timeout_s_);
  s.SendLine("LIST " + prefix);
  const int count = Count(Expect(s, "LIST"), s);
  std::vector<Item> out(size_t(std::max(0, count)));
  for (Item& i : out) {
    std::istringstream line(s.RecvLine());
    std::string hex, where;
    if (!(line >> i.key >> i.bytes >> hex >> where))
      throw Error(ExitCode::kRuntime, "tier-0 holder " + a_.Name() +
                                          ": a LIST line that does not "
                                          "parse (not keel's holder?)");
    i.xxh3 = ParseHexHash(hex, "tier-0 holder " + a_.Name());
    i.from_disk = where == "disk";
  }
  return out;
}

void Client::Get(const std::string& key, uint64_t offset, uint64_t n, void* dst) const {
  Reader(a_, timeout_s_).Get(key, offset, n, dst);
}

Reader::Reader(Address a, double timeout_s) : a_(std::move(a)), timeout_s_(timeout_s) {}
Reader::~Reader() = default;
Reader::Reader(Reader&&) noexcept = default;

void Reader::Get(const std::string& key, uint64_t offset, uint64_t n, void* dst) {
  for (bool kept = s_ != nullptr;; kept = false) {
    try {
      if (!s_) s_ = std::make_unique<Socket>(Socket::Connect(a_.host, a_.port, timeout_s_));
      s_->SendLine("GET " + key + " " + std::to_string(offset) + " " + std::to_string(n));
      Expect(*s_, "GET " + key);
      s_->RecvAll(dst, n);
      return;
    } catch (const Error&) {
      s_.reset();  // what is left on it cannot be told from the next reply
      if (!kept) throw;
    }
  }
}

int Client::Trim(const std::string& run, int64_t max_step) const {
  Socket s = Socket::Connect(a_.host, a_.port, timeout_s_);
  s.SendLine("TRIM " + run + " " + std::to_string(max_step));
  return Count(Expect(s, "TRIM"), s);
}

void Client::Quit() const {
  Socket s = Socket::Connect(a_.host, a_.port, timeout_s_);
  s.SendLine("QUIT -");
  Expect(s, "QUIT");
}

}  // namespace keel::ckpt::peer
