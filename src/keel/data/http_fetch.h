// Downloads one http(s) URL into a local file with libcurl, with timeouts and retries, and hashes
// the bytes as they arrive (XXH3-64) so that a multi-GiB shard is never read twice. Used by
// RemoteCache (remote_cache.h) to pull datasets from object storage or a plain web server.
//
//   keel::data::HttpOptions opts;                 // 3 tries, 0.2 s, 0.4 s backoff
//   uint64_t h = keel::data::HttpDownload("http://host/train/meta.json", "/tmp/m.part", opts);
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace keel::data {

struct HttpOptions {
  // Attempts in all; between them the wait doubles from backoff_s. Only transient failures are
  // retried (no connection, a timeout, a dropped transfer, HTTP 5xx); a 404 is final.
  int tries = 3;
  double backoff_s = 0.2;
  long connect_timeout_s = 10;
  // A transfer slower than 1 byte/s for this long is a dead peer, not a slow one.
  long stall_timeout_s = 30;
  // When set and true, a download in progress (or waiting to retry) stops with an error: lets
  // the owner of a background fetch shut down without waiting for a whole shard.
  const std::atomic<bool>* cancel = nullptr;
};

// True for "http://..." and "https://...".
bool IsHttpUrl(std::string_view path);

// Writes the body of URL to PATH (created or truncated) and returns the XXH3-64 of its bytes.
// Throws keel::Error, one line naming the URL: bad input for an HTTP 4xx (the URL is wrong),
// runtime after `tries` transient failures (the server is down or unreachable) or when
// cancelled. PATH is removed on failure.
uint64_t HttpDownload(const std::string& url, const std::string& path, const HttpOptions& options);

}  // namespace keel::data
