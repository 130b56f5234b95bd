// Where model buffers live: host memory, or a device's. Everything above kernels/ allocates,
// zeroes and copies parameters, gradients, optimizer state and activations through a Memory
// (kernels::Backend is one), never with aligned_alloc/memset/memcpy, so that the same model,
// step, optimizer and checkpoint staging run on a GPU.
//
//   const Memory& mem = backend;          // or HostMemory()
//   Buffer params(mem, n * sizeof(float));
//   mem.Zero(params.data(), params.bytes());
//   mem.ToHost(host.data(), params.data(), params.bytes());
#pragma once

#include <cstddef>
#include <utility>

namespace keel {

class Memory {
 public:
  virtual ~Memory() = default;
  // Whether a pointer from Alloc can be read and written by the host directly.
  virtual bool host_visible() const = 0;
  // 64-byte-aligned and uninitialized; throws std::bad_alloc when there is none.
  virtual void* Alloc(size_t bytes) const = 0;
  virtual void Free(void* p) const = 0;
  virtual void Zero(void* p, size_t bytes) const = 0;
  // Within this memory, host → this memory, this memory → host. Ordered after every operation
  // already issued on the memory's compute stream, and complete on return.
  virtual void Copy(void* dst, const void* src, size_t bytes) const = 0;
  virtual void FromHost(void* dst, const void* host, size_t bytes) const = 0;
  virtual void ToHost(void* host, const void* src, size_t bytes) const = 0;
  // Page-locks host memory so that copies to and from it run asynchronously at full bandwidth
  // (checkpoint staging); a no-op where host memory is the memory.
  virtual void PinHost(void* /*p*/, size_t /*bytes*/) const {}
  virtual void UnpinHost(void* /*p*/) const {}
  // Copies to the host that overlap the work issued after them (checkpoint staging): CopyStream()
  // starts a batch ordered after everything issued on the compute stream so far, ToHostAsync
  // adds to it (into pinned memory for full speed), WaitCopies returns once it has landed. Where
  // this memory is the host's, ToHostAsync copies at once.
  virtual void* CopyStream() const { return nullptr; }
  virtual void ToHostAsync(void* host, const void* src, size_t bytes, void* /*stream*/) const {
    ToHost(host, src, bytes);
  }
  virtual void WaitCopies(void* /*stream*/) const {}
};

// Plain host memory: what the CPU backend uses, and what host-only code asks for.
const Memory& HostMemory();

// Host memory for the buffers kernels stream through (HostMemory's blocks, the kernels' scratch,
// checkpoint staging): the bytes asked for rounded up to 64, uninitialized, 64-byte aligned,
// released with std::free; throws std::bad_alloc. Blocks of 2 MiB and more start on a 2 MiB
// boundary and are advised for transparent huge pages (Debian's default is "madvise": none
// without the advice): a GPT-2 step streams gigabytes through its products and AdamW, and on
// 4 KiB pages their TLB misses cost 2-5% of the step.
void* AllocHostAligned(size_t bytes);

// An owned block of one Memory: one per kind (parameters, gradients, master weights, moments,
// activations), allocated once before the first step. Uninitialized until zeroed or filled.
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Memory& mem, size_t bytes)
      : mem_(&mem), data_(bytes ? mem.Alloc(bytes) : nullptr), bytes_(bytes) {}
  Buffer(Buffer&& o) noexcept
      : mem_(o.mem_), data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(mem_, o.mem_);
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (data_) mem_->Free(data_);
  }

  // Allocated and zeroed.
  static Buffer Zeroed(const Memory& mem, size_t bytes) {
    Buffer b(mem, bytes);
    if (bytes) mem.Zero(b.data_, bytes);
    return b;
  }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const Memory* memory() const { return mem_; }

 private:
  const Memory* mem_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace keel
