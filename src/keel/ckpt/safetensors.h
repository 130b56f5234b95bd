// safetensors files: an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the raw little-endian data. The format Hugging Face tools
// read, and the one `keel generate` loads a trained model from.
//
//   SafetensorsWriter w;
//   w.Add("wte.weight", {50304, 768}, data);
//   w.SetMetadata("keel.n_layer", "12");
//   w.Write("runs/x/model.safetensors");     // tmp file + fsync + rename: never half-written
//
//   auto f = SafetensorsFile::Read("runs/x/model.safetensors");
//   const auto& t = f.Get("wte.weight");      // t.shape, t.data (fp32)
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace keel::ckpt {

struct Fp32Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

class SafetensorsWriter {
 public:
  // Copies nothing: `data` must stay alive until Write.
  void Add(const std::string& name, std::vector<int64_t> shape, const float* data);
  void SetMetadata(const std::string& key, const std::string& value);
  // Writes atomically (temporary name, fsync, rename). Throws keel::Error on I/O failure.
  void Write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    const float* data;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A file's header, checked as SafetensorsFile::Read checks it (dtypes, shapes, offsets that tile
// the data), with each tensor read when asked for: what reads a model larger than memory in fp32
// a tensor at a time.
class SafetensorsIndex {
 public:
  struct Entry {
    std::string dtype;  // F32, BF16 or F16
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // from the data's start
    size_t numel = 0;
  };
  static SafetensorsIndex Open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const Entry& Get(const std::string& name) const;  // throws (bad input) if missing
  // Tensor `name` converted to fp32 into `out` (its numel floats). Throws keel::Error (bad input)
  // naming the file and the tensor where an element is not finite, or the file is short.
  void ReadInto(const std::string& name, float* out) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsFile {
 public:
  // Reads every tensor (F32, F16 or BF16; converted to fp32). Throws keel::Error (bad input)
  // naming the file and what is wrong: short file, bad header, out-of-range offsets.
  static SafetensorsFile Read(const std::string& path);

  const Fp32Tensor& Get(const std::string& name) const;  // throws if missing
  bool Has(const std::string& name) const { return tensors_.count(name) > 0; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::map<std::string, Fp32Tensor>& tensors() const { return tensors_; }

 private:
  std::string path_;
  std::map<std::string, Fp32Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace keel::ckpt
