// An owned, 64-byte-aligned, uninitialized block of memory: one per kind (parameters, gradients,
// master weights, moments, activations), allocated once before the first step.
//
//   keel::Buffer params(n * sizeof(float));
//   float* p = params.as<float>();
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <utility>

namespace keel {

class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    data_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!data_) throw std::bad_alloc();
  }
  Buffer(Buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { std::free(data_); }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace keel
