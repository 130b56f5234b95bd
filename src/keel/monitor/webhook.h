// Posts JSON bodies to a URL from a background thread (libcurl), so that a slow or unreachable
// receiver never holds the training loop up. Bodies wait in a bounded queue; a failed post is
// reported once on stderr and dropped (an alert is also in events.jsonl and on the console).
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

namespace keel::monitor {

class Webhook {
 public:
  explicit Webhook(std::string url);
  ~Webhook();  // sends what is queued (5 s at most each), then stops

  void Post(std::string json_body);

 private:
  void Run();

  const std::string url_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  bool stop_ = false, warned_ = false;
  std::thread thread_;
};

}  // namespace keel::monitor
