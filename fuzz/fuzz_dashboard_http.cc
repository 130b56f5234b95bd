// Fuzzes `keel dashboard`'s HTTP server (monitor::MakeDashboardServer: cpp-httplib's request
// parsing, the token check, the routes and their query parameters, reading a run's JSONL files
// from a fuzzed byte offset) with what a client sends on one connection. Whatever comes back must
// be HTTP.
//
// Input: a selector byte, then what the client sends (at most 64 KiB). The selector's bit 0 picks
// the server: set, it needs the token "t0k" (`keel dashboard --token t0k`); clear, none. Its bit 1
// picks how the client behaves:
//   clear  it sends the rest and shuts its side down, so every read past it sees EOF at once.
//          httplib 0.11 writes nothing to a peer that has shut down (SocketStream::is_writable
//          peeks for EOF), so only the first request is routed and nothing comes back: the
//          fastest way through the handlers.
//   set    the rest is requests separated by kSep (fuzz_util.h). The client sends the first, and
//          each next one once the server has read all it was sent (httplib drops what it read
//          past a request, so requests sent together would be lost), reading the responses all
//          along; after the last, once the server waits for input (see ServerWaits), it shuts
//          its side down and the server closes the connection.
// The connection is served on the calling thread (GuardedServer::ServeConnection), the client is
// a thread of the target's, on the two ends of a socketpair.
#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "fuzz_util.h"
#include "keel/monitor/dashboard_server.h"

namespace {

constexpr size_t kMaxInput = 64 << 10;

// A run folder with lines as keel train writes them, a bad line and an unfinished last line.
const char kMetrics[] =
    "{\"step\":1,\"loss\":3.2,\"ms\":10,\"tokens_per_s\":1000}\n"
    "{\"step\":2,\"loss\":3.1,\"ms\":11,\"lr\":0.001}\n"
    "not json\n"
    "{\"step\":3,\"loss\":\"nan\",\"ms\":9}\n"
    "{\"step\":4,\"lo";
const char kEvents[] =
    "{\"event\":\"start\",\"time\":1.5}\n"
    "{\"event\":\"checkpoint\",\"step\":2,\"path\":\"checkpoints/step_2\"}\n"
    "[1,2,3]\n";

struct Server {
  keel::monitor::DashboardOptions options;
  std::unique_ptr<keel::monitor::GuardedServer> server;
};

// The two servers (with the token, without), made once: each keeps a reaper thread and a
// listening socket for the life of the process.
keel::monitor::GuardedServer& Pick(bool with_token) {
  static keel::fuzz::Scratch dir("dashboard_http");
  static Server servers[2];
  static const bool made = [] {
    dir.Write("metrics.jsonl", kMetrics);
    dir.Write("events.jsonl", kEvents);
    dir.Write("goodput.json", "{\"goodput\":0.9,\"restarts\":1}\n");
    for (int i = 0; i < 2; ++i) {
      Server& s = servers[i];
      s.options.runs = {dir.path()};
      s.options.port = 0;
      s.options.token = i == 1 ? "t0k" : "";
      keel::fuzz::ExpectSuccess("making the dashboard server", [&] {
        s.server = keel::monitor::MakeDashboardServer(s.options, "/* chart.js */ var Chart;");
      });
      // 10 ms instead of 5 s for a request that stops midway: a fuzzed one often does. (The
      // keep-alive wait is 10 ms in httplib whatever is set; 0 ends it there.)
      s.server->set_read_timeout(0, 10000);
      s.server->set_keep_alive_timeout(0);
      if (s.server->Listen("127.0.0.1", 0) <= 0)
        keel::fuzz::Scratch::Fail("cannot listen on 127.0.0.1");
    }
    return true;
  }();
  (void)made;
  return *servers[with_token ? 1 : 0].server;
}

// Queues `bytes` on the client's socket without blocking; what does not fit is cut (the buffer
// holds the 64 KiB an input can have).
void Send(int client, const std::string& bytes) {
  for (size_t at = 0; at < bytes.size();) {
    const ssize_t n =
        ::send(client, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) return;
    at += size_t(n);
  }
}

// Bytes the client sent that the server has not read yet.
int Unread(int client) {
  int n = 0;
  return ::ioctl(client, SIOCOUTQ, &n) == 0 ? n : 1;
}

// Whether thread `tid` (the server's) is blocked waiting for input: in poll(2) with a 10 ms
// timeout, which httplib 0.11 uses for nothing else here (its keep-alive wait, and the read
// timeout set above; writes wait 5 s, its liveness checks 0). Linux's /proc/PID/task/TID/syscall
// reads "NR ARG1 ARG2 ARG3 ..." for a blocked thread, "running" otherwise. Should httplib wait
// another way, this says no and the connection ends by the server's own 10 ms timeouts: slower,
// the same result.
bool ServerWaits(pid_t tid) {
  const std::string path = "/proc/self/task/" + std::to_string(tid) + "/syscall";
  char text[256] = {};
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    const size_t n = std::fread(text, 1, sizeof text - 1, f);
    std::fclose(f);
    text[n] = '\0';
  }
#ifdef SYS_poll
  long nr = -1;
  unsigned long fds = 0, nfds = 0, timeout_ms = 0;
  return std::sscanf(text, "%ld %lx %lx %lx", &nr, &fds, &nfds, &timeout_ms) == 4 &&
         nr == SYS_poll && timeout_ms == 10;
#else
  return false;  // glibc's poll is ppoll there (aarch64), with a timespec: not read here
#endif
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  keel::monitor::GuardedServer& server = Pick(data[0] & 1);
  const bool whole = data[0] & 2;
  const size_t n = std::min(size - 1, kMaxInput);
  const std::vector<std::string> requests =
      whole ? keel::fuzz::SplitParts(data + 1, n, 16)
            : std::vector<std::string>{keel::fuzz::Text(data + 1, n)};

  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    keel::fuzz::Scratch::Fail("socketpair failed");
  const int client = fds[0], served = fds[1];
  const int big = 1 << 20;
  ::setsockopt(client, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  Send(client, requests[0]);
  if (!whole) ::shutdown(client, SHUT_WR);

  // The client reads while the server writes (a page is larger than a socket buffer).
  const pid_t server_tid = pid_t(::syscall(SYS_gettid));
  std::string response;
  std::thread reader([&] {
    char buf[16384];
    bool shut = !whole;
    for (size_t next = 1;;) {
      pollfd p{client, POLLIN, 0};
      const timespec tick{0, 100 * 1000};
      if (::ppoll(&p, 1, shut ? nullptr : &tick, nullptr) > 0) {
        const ssize_t got = ::recv(client, buf, sizeof buf, 0);
        if (got <= 0) break;  // the server closed the connection
        response.append(buf, size_t(got));
        continue;
      }
      if (shut || Unread(client) != 0) continue;
      if (next < requests.size()) {
        Send(client, requests[next++]);
      } else if (ServerWaits(server_tid) && Unread(client) == 0) {
        ::shutdown(client, SHUT_WR);
        shut = true;
      }
    }
  });
  server.ServeConnection(served);  // closes `served`
  reader.join();
  ::close(client);

  keel::fuzz::Check(
      response.empty() || response.rfind("HTTP/1.1 ", 0) == 0,
      "the server answered with something other than HTTP/1.1: " + response.substr(0, 40));
  return 0;
}
