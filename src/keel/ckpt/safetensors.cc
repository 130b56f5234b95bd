#include "keel/ckpt/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "keel/core/dtype.h"
#include "keel/core/error.h"

namespace keel::ckpt {
namespace {

void WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      ThrowRuntime("write " + path + ": " + std::strerror(errno));
    }
    p += w;
    n -= size_t(w);
  }
}

}  // namespace

void SafetensorsWriter::Add(const std::string& name, std::vector<int64_t> shape,
                            const float* data) {
  entries_.push_back({name, std::move(shape), data});
}

void SafetensorsWriter::SetMetadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

void SafetensorsWriter::Write(const std::string& path) const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();  // "{}", not "null", if empty
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  size_t offset = 0;
  for (const auto& e : entries_) {
    size_t n = 1;
    for (int64_t d : e.shape) n *= size_t(d);
    header[e.name] = {
        {"dtype", "F32"}, {"shape", e.shape}, {"data_offsets", {offset, offset + n * 4}}};
    offset += n * 4;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the data then starts 8-byte aligned
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) ThrowRuntime("open " + tmp + ": " + std::strerror(errno));
  try {
    uint64_t len = h.size();
    WriteAll(fd, &len, 8, tmp);
    WriteAll(fd, h.data(), h.size(), tmp);
    for (const auto& e : entries_) {
      size_t n = 1;
      for (int64_t d : e.shape) n *= size_t(d);
      WriteAll(fd, e.data, n * 4, tmp);
    }
    if (::fsync(fd) != 0) ThrowRuntime("fsync " + tmp + ": " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    ThrowRuntime("rename " + tmp + " to " + path + ": " + std::strerror(errno));
}

SafetensorsIndex SafetensorsIndex::Open(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ThrowBadInput(path + ": cannot open (expected a .safetensors file)");
  in.seekg(0, std::ios::end);
  const uint64_t size = uint64_t(in.tellg());
  in.seekg(0);
  uint64_t hlen = 0;
  if (size < 8 || !in.read(reinterpret_cast<char*>(&hlen), 8))
    ThrowBadInput(path + ": shorter than the 8-byte header length");
  if (hlen > size - 8)
    ThrowBadInput(path + ": header length " + std::to_string(hlen) + " runs past the end of the " +
                  std::to_string(size) + "-byte file");
  std::string h(hlen, '\0');
  in.read(h.data(), std::streamsize(hlen));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(h);
  } catch (const std::exception& e) {
    ThrowBadInput(path + ": header is not valid JSON (" + e.what() + ")");
  }
  SafetensorsIndex f;
  f.path_ = path;
  f.data_start_ = 8 + hlen;
  const uint64_t data_size = size - f.data_start_;
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> ranges;  // to check the tiling
  // Checked here, not left to nlohmann's exceptions, which would escape as internal errors.
  if (!header.is_object()) ThrowBadInput(path + ": header is not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) ThrowBadInput(path + ": __metadata__ is not an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          ThrowBadInput(path + ": __metadata__ \"" + m.key() + "\" is not a string");
        f.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor \"" + it.key() + "\"";
    try {
      Entry e;
      e.dtype = it->at("dtype").get<std::string>();
      // Integers only: nlohmann casts a number such as 1e30 to an integer type, which is undefined
      // behaviour out of the type's range.
      for (const char* key : {"shape", "data_offsets"})
        for (const auto& v : it->at(key))
          if (!v.is_number_integer()) ThrowBadInput(where + ": " + key + ": expected integers");
      e.shape = it->at("shape").get<std::vector<int64_t>>();
      auto off = it->at("data_offsets").get<std::vector<uint64_t>>();
      // A negative or overflowing shape could otherwise wrap to a count that matches the range.
      size_t n = 1;
      for (int64_t d : e.shape)
        if (d < 0 || __builtin_mul_overflow(n, size_t(d), &n))
          ThrowBadInput(where + ": shape " + it->at("shape").dump() + " is negative or too large");
      const size_t esize = e.dtype == "F32" ? 4 : (e.dtype == "BF16" || e.dtype == "F16") ? 2 : 0;
      if (esize == 0) ThrowBadInput(where + ": dtype " + e.dtype + " (expected F32, BF16 or F16)");
      if (off.size() != 2 || off[1] < off[0] || off[1] > data_size || n > data_size / esize ||
          off[1] - off[0] != n * esize)
        ThrowBadInput(where + ": data_offsets do not match its shape and the file's size");
      ranges.emplace_back(off[0], off[1], it.key());
      e.begin = off[0];
      e.numel = n;
      f.entries_[it.key()] = std::move(e);
    } catch (const nlohmann::json::exception& e) {
      ThrowBadInput(where + ": malformed entry (" + e.what() + ")");
    }
  }
  // The format: the tensors' byte ranges tile the data exactly, no overlap and no hole.
  std::sort(ranges.begin(), ranges.end());
  uint64_t end = 0;
  std::string prev = "the start of the data";
  for (const auto& [b, e, name] : ranges) {
    if (b < end)
      ThrowBadInput(path + ": tensor \"" + name + "\" overlaps " + prev + " (data_offsets [" +
                    std::to_string(b) + ", " + std::to_string(e) + ") start before byte " +
                    std::to_string(end) + ")");
    if (b > end)
      ThrowBadInput(path + ": data bytes [" + std::to_string(end) + ", " + std::to_string(b) +
                    ") belong to no tensor (the format allows no holes)");
    end = e;
    prev = "tensor \"" + name + "\"";
  }
  if (end != data_size)
    ThrowBadInput(path + ": data bytes [" + std::to_string(end) + ", " + std::to_string(data_size) +
                  ") after the last tensor belong to no tensor (the format allows no holes)");
  return f;
}

const SafetensorsIndex::Entry& SafetensorsIndex::Get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) ThrowBadInput(path_ + ": no tensor named \"" + name + "\"");
  return it->second;
}

void SafetensorsIndex::ReadInto(const std::string& name, float* out) const {
  const Entry& e = Get(name);
  const std::string where = path_ + ": tensor \"" + name + "\"";
  const size_t n = e.numel, esize = e.dtype == "F32" ? 4 : 2;
  std::ifstream in(path_, std::ios::binary);
  if (!in) ThrowBadInput(path_ + ": cannot open (expected a .safetensors file)");
  in.seekg(std::streamoff(data_start_ + e.begin));
  if (e.dtype == "F32") {
    // host: a tensor read from a file into host memory
    in.read(reinterpret_cast<char*>(out), std::streamsize(n * esize));
  } else {
    std::vector<char> raw(n * esize);
    in.read(raw.data(), std::streamsize(raw.size()));
    if (e.dtype == "BF16") {
      ConvertBf16ToF32(out, reinterpret_cast<const bf16*>(raw.data()), n);
    } else {
      for (size_t i = 0; i < n; ++i) {
        uint16_t hbits;
        std::memcpy(&hbits, raw.data() + 2 * i, 2);
        _Float16 hv;
        std::memcpy(&hv, &hbits, 2);
        out[i] = float(hv);
      }
    }
  }
  if (!in) ThrowBadInput(where + ": the file ended inside its data (was it changed while read?)");
  // NaN or Inf weights are never a model to start from or sample: refuse them by name.
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(out[i]))
      ThrowBadInput(where + ": element " + std::to_string(i) + " is " +
                    (std::isnan(out[i]) ? "NaN" : "infinite") + " (the weights are not finite)");
}

SafetensorsFile SafetensorsFile::Read(const std::string& path) {
  const SafetensorsIndex index = SafetensorsIndex::Open(path);
  SafetensorsFile f;
  f.path_ = path;
  f.metadata_ = index.metadata();
  for (const auto& [name, e] : index.entries()) {
    Fp32Tensor t;
    t.shape = e.shape;
    t.data.resize(e.numel);
    index.ReadInto(name, t.data.data());
    f.tensors_[name] = std::move(t);
  }
  return f;
}

const Fp32Tensor& SafetensorsFile::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) ThrowBadInput(path_ + ": no tensor named \"" + name + "\"");
  return it->second;
}

}  // namespace keel::ckpt
