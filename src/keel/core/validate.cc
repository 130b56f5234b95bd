#include "keel/core/validate.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "keel/core/error.h"

namespace keel {
namespace {

// inet_pton's own grammar for IPv4 (four decimal parts, each 0-255) is the one wanted; it refuses
// "999.1.1.1", "1.2.3" and "1.2.3.4x", which getaddrinfo and civetweb would take.
bool IsIpv4(const std::string& s) {
  in_addr a{};
  return inet_pton(AF_INET, s.c_str(), &a) == 1;
}

bool IsIpv6(const std::string& s) {
  in6_addr a{};
  return inet_pton(AF_INET6, s.c_str(), &a) == 1;
}

std::string Unbracket(const std::string& s) {
  return s.size() >= 2 && s.front() == '[' && s.back() == ']' ? s.substr(1, s.size() - 2) : s;
}

// A DNS name: labels of letters, digits and '-', separated by dots (RFC 1123).
bool IsHostName(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  size_t label = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == '.') {
      if (label == 0 || label > 63 || s[i - 1] == '-') return false;
      label = 0;
      continue;
    }
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (!(std::isalnum(c) || (c == '-' && label > 0))) return false;
    ++label;
  }
  // All digits and dots is an IPv4 address that inet_pton refused, not a name.
  return s.find_first_not_of("0123456789.") != std::string::npos;
}

std::string Quote(const std::string& s) { return "\"" + s + "\""; }

}  // namespace

std::string CheckListenAddress(const std::string& what, const std::string& addr) {
  if (addr == "localhost" || IsIpv4(addr)) return addr;
  const std::string v6 = Unbracket(addr);
  if (IsIpv6(v6)) return v6;
  ThrowBadInput(what + ": " + Quote(addr) +
                " is not an address to listen on (expected an IPv4 address such as 127.0.0.1 or "
                "0.0.0.0, an IPv6 address such as ::1, or localhost)");
}

bool IsLoopbackAddress(const std::string& addr) {
  if (addr == "localhost") return true;
  in_addr a4{};
  if (inet_pton(AF_INET, addr.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  return inet_pton(AF_INET6, Unbracket(addr).c_str(), &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

void CheckHttpUrl(const std::string& what, const std::string& url) {
  auto fail = [&](const std::string& why) {
    ThrowBadInput(what + ": " + Quote(url) + ": " + why +
                  " (expected http://HOST[:PORT][/PATH] or https://...)");
  };
  const size_t sep = url.find("://");
  if (sep == std::string::npos) fail("no scheme");
  const std::string scheme = url.substr(0, sep);
  if (scheme != "http" && scheme != "https") fail("the scheme is not http or https");
  const size_t start = sep + 3;
  const size_t slash = url.find_first_of("/?#", start);
  std::string authority =
      url.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
  for (char c : url)
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) fail("a space or control character");
  if (const size_t at = authority.rfind('@'); at != std::string::npos)
    authority = authority.substr(at + 1);  // user:password@ is libcurl's to send
  std::string host, port_text;
  if (!authority.empty() && authority[0] == '[') {
    const size_t close = authority.find(']');
    if (close == std::string::npos) fail("an unclosed [ in the host");
    host = authority.substr(1, close - 1);
    if (!IsIpv6(host)) fail("the host in [...] is not an IPv6 address");
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') fail("expected :PORT after the IPv6 address");
      port_text = authority.substr(close + 2);
      if (port_text.empty()) fail("an empty port");
    }
  } else {
    const size_t colon = authority.find(':');
    host = authority.substr(0, colon);
    if (colon != std::string::npos) {
      port_text = authority.substr(colon + 1);
      if (port_text.empty()) fail("an empty port");
    }
    if (host.empty()) fail("no host");
    if (!IsIpv4(host) && !IsHostName(host)) fail("the host is not a name or an address");
  }
  if (!port_text.empty()) {
    if (port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos)
      fail("the port is not a number");
    const int port = std::stoi(port_text);
    if (port < 1 || port > 65535) fail("the port is not in 1-65535");
  }
}

double MemAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

void CheckAllocation(const std::string& what, double bytes) {
  const double available = MemAvailableBytes();
  if (available <= 0 || bytes <= available) return;
  char text[160];
  std::snprintf(text, sizeof text,
                " needs %.1f GiB of memory; this machine has %.1f GiB available (MemAvailable)",
                bytes / double(1 << 30), available / double(1 << 30));
  ThrowBadInput(what + text);
}

void CheckRange(const std::string& what, double value, double lo, double hi) {
  if (value >= lo && value <= hi) return;
  char text[160];
  std::snprintf(text, sizeof text, ": expected a number in [%.10g, %.10g], got %.10g", lo, hi,
                value);
  ThrowBadInput(what + text);
}

void CheckRegularFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    ThrowBadInput(path + ": cannot read: " + std::strerror(errno));
  if (S_ISREG(st.st_mode)) return;
  const char* kind = S_ISDIR(st.st_mode)    ? "a folder"
                     : S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                                            : "not a regular file";
  ThrowBadInput(path + ": expected a regular file, found " + kind);
}

void CheckCanCreateFolder(const std::string& what, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  while (!p.empty() && !fs::exists(fs::symlink_status(p, ec))) p = p.parent_path();
  if (p.empty()) return;
  if (!fs::is_directory(p, ec))
    ThrowBadInput(what + " " + path + ": " + p.string() + " is a file, not a folder");
  if (::access(p.c_str(), W_OK) != 0)
    ThrowBadInput(what + " " + path + ": cannot write in " + p.string() + ": " +
                  std::strerror(errno));
}

void CheckNotAnInput(const std::string& what, const std::string& out,
                     const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path o = fs::weakly_canonical(out, ec);
  for (const std::string& in : inputs) {
    std::error_code ec2;
    const bool same = fs::exists(out, ec2) && fs::exists(in, ec2)
                          ? fs::equivalent(out, in, ec2)
                          : (!ec && o == fs::weakly_canonical(in, ec2));
    if (same)
      ThrowBadInput(what + " " + out + ": is " + in +
                    ", which this command reads; writing it would destroy it (pick another path)");
  }
}

}  // namespace keel
