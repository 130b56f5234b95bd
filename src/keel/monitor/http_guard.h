// keel dashboard's front door. cpp-httplib (Debian 12 ships 0.11.4) accepts connections into a
// fixed pool of threads (8 on a small machine) and times out each read, but every byte restarts
// the timer: a client that sends a byte every few seconds holds a thread for good, and a handful
// of such connections make the page unreachable for everyone (slowloris). GuardedServer is an
// httplib::Server (routes are added as usual) that accepts connections itself and serves each on
// a thread of its own with:
//   - a cap on the connections open at once from one client address (more are closed at once),
//   - a deadline on each connection's whole life (its socket is shut down when it passes; a
//     browser opens a new one for its next poll),
//   - a cap on all connections open at once.
//
//   GuardedServer svr(GuardedServer::Limits{});
//   svr.Get("/", ...);
//   const int port = svr.Listen("127.0.0.1", 0);   // -1: cannot bind
//   std::thread t([&] { svr.Run(); });  ...  svr.Stop(); t.join();
#pragma once

#include <httplib.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace keel::monitor {

class GuardedServer : public httplib::Server {
 public:
  struct Limits {
    int per_client = 6;      // connections open at once from one address
    int total = 64;          // connections open at once
    double deadline_s = 15;  // a connection's whole life
  };
  explicit GuardedServer(Limits limits);
  ~GuardedServer() override;

  // Binds addr:port (0: any free port). Returns the port, or -1 if it cannot.
  int Listen(const std::string& addr, int port);
  // Accepts and serves until Stop().
  void Run();
  // Stops accepting, shuts the open connections down and waits for their threads.
  void Stop();
  // Serves one connection on the calling thread and closes it, as Run does for each: the fuzz
  // target's entry. Needs Listen first (httplib serves only while a listening socket exists).
  bool ServeConnection(int sock);

 private:
  void Reap();

  const Limits limits_;
  int listen_fd_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  int open_ = 0;
  std::map<std::string, int> per_client_;
  struct Open {
    int fd;  // a dup of the connection's socket, for shutting it down
    double started;
    bool shut;
  };
  std::map<int, Open> conns_;  // by id
  int next_id_ = 0;
  std::thread reaper_;
};

}  // namespace keel::monitor
