// Small file helpers (data/, ckpt/, resilience/ and train/ use them): whole-file reads with errors
// that name the path, a read-only memory map (RAII, move-only), and atomic replace-by-rename
// writes.
//
//   keel::MappedFile f = keel::MappedFile::Open("train/shard_00000.bin");
//   auto tokens = reinterpret_cast<const uint16_t*>(f.data());
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace keel {

// Throws keel::Error (bad input) "PATH: cannot read: REASON".
std::string ReadWholeFile(const std::string& path);

// Writes `bytes` to PATH.tmp, fsyncs it, renames it over PATH and fsyncs the folder, so that a
// crash leaves either the old file or the new one, never a torn one.
void WriteFileAtomic(const std::string& path, std::string_view bytes);

// fsync of a folder, so that renames inside it survive a power loss. Errors are ignored: some
// file systems refuse to fsync a folder, and the data is still correct without it.
void SyncDir(const std::string& dir);

class MappedFile {
 public:
  // Maps the whole file read-only. An empty file is valid and has data() == nullptr.
  static MappedFile Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace keel
