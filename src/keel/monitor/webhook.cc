#include "keel/monitor/webhook.h"

#include <curl/curl.h>

#include "keel/core/log.h"

namespace keel::monitor {
namespace {

size_t Discard(char*, size_t size, size_t n, void*) { return size * n; }

}  // namespace

Webhook::Webhook(std::string url) : url_(std::move(url)), thread_([this] { Run(); }) {}

Webhook::~Webhook() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Webhook::Post(std::string json_body) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= 100) queue_.pop_front();  // a dead receiver costs memory, not the run
    queue_.push_back(std::move(json_body));
  }
  cv_.notify_all();
}

void Webhook::Run() {
  for (;;) {
    std::string body;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      body = std::move(queue_.front());
      queue_.pop_front();
    }
    CURL* curl = curl_easy_init();
    if (!curl) continue;
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    curl_easy_setopt(curl, CURLOPT_URL, url_.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, long(body.size()));
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 5L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Discard);
    const CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    if ((rc != CURLE_OK || status >= 300) && !warned_) {
      warned_ = true;
      Log("keel: warning: [monitor.alerts] webhook %s: %s; alerts stay in events.jsonl",
          url_.c_str(),
          rc != CURLE_OK ? curl_easy_strerror(rc) : ("HTTP " + std::to_string(status)).c_str());
    }
  }
}

}  // namespace keel::monitor
