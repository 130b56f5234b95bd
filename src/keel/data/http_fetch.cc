// libcurl downloads with retries and on-the-fly hashing; see http_fetch.h.
#include "keel/data/http_fetch.h"

#include <curl/curl.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>

#include "keel/core/error.h"

namespace keel::data {
namespace {

// curl_global_init is not thread-safe and must run once before any easy handle exists.
void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Sink {
  std::FILE* file = nullptr;
  XXH3_state_t* hash = nullptr;
  bool write_failed = false;
};

size_t OnData(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  const size_t bytes = size * n;
  if (std::fwrite(data, 1, bytes, sink->file) != bytes) {
    sink->write_failed = true;
    return 0;  // makes curl abort with CURLE_WRITE_ERROR
  }
  XXH3_64bits_update(sink->hash, data, bytes);
  return bytes;
}

// libcurl calls this often during a transfer; non-zero aborts it (CURLE_ABORTED_BY_CALLBACK).
int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* cancel = static_cast<const std::atomic<bool>*>(user);
  return cancel && cancel->load() ? 1 : 0;
}

struct CurlFree {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct HashFree {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};

// Worth another try: the peer may come back or the network may recover.
bool IsTransient(CURLcode rc, long status) {
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    case CURLE_HTTP_RETURNED_ERROR:
      return status >= 500 || status == 429;
    default:
      return false;
  }
}

}  // namespace

bool IsHttpUrl(std::string_view path) {
  return path.starts_with("http://") || path.starts_with("https://");
}

uint64_t HttpDownload(const std::string& url, const std::string& path, const HttpOptions& options) {
  GlobalInit();
  std::unique_ptr<CURL, CurlFree> curl(curl_easy_init());
  std::unique_ptr<XXH3_state_t, HashFree> hash(XXH3_createState());
  if (!curl || !hash) ThrowRuntime(url + ": cannot start a download (out of memory?)");
  char errbuf[CURL_ERROR_SIZE] = {};
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);  // a 404 page must never become a shard
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);     // timeouts without SIGALRM, safe in threads
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, options.connect_timeout_s);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, options.stall_timeout_s);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnData);
  if (options.cancel) {
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, OnProgress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, options.cancel);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  }
  auto cancelled = [&] { return options.cancel && options.cancel->load(); };

  const int tries = options.tries < 1 ? 1 : options.tries;
  std::string last;
  for (int attempt = 0; attempt < tries; ++attempt) {
    if (attempt > 0) {
      std::this_thread::sleep_for(
          std::chrono::duration<double>(options.backoff_s * double(1 << (attempt - 1))));
    }
    if (cancelled()) ThrowRuntime(url + ": download cancelled");
    // Each try starts from an empty file: a dropped transfer leaves no bytes behind.
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) ThrowRuntime(path + ": cannot create (downloading " + url + ")");
    Sink sink{f, hash.get(), false};
    XXH3_64bits_reset(hash.get());
    errbuf[0] = '\0';
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
    CURLcode rc = curl_easy_perform(c);
    const bool close_failed = std::fclose(f) != 0;
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (rc == CURLE_OK && !close_failed) return XXH3_64bits_digest(hash.get());
    std::remove(path.c_str());
    if (cancelled()) ThrowRuntime(url + ": download cancelled");
    if (sink.write_failed || close_failed) {
      ThrowRuntime(url + ": cannot write " + path + " (disk full?)");
    }
    last = errbuf[0] ? errbuf : curl_easy_strerror(rc);
    if (!IsTransient(rc, status)) {
      if (rc == CURLE_HTTP_RETURNED_ERROR) {
        ThrowBadInput(url + ": HTTP " + std::to_string(status) +
                      " (expected a keel-tokens dataset file there)");
      }
      ThrowRuntime(url + ": download failed: " + last);
    }
  }
  ThrowRuntime(url + ": download failed after " + std::to_string(tries) + " tries: " + last);
}

}  // namespace keel::data
