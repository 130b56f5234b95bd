// Internal to the tokenizer: two open-addressing hash tables tuned for the BPE hot loop.
//
// BytesTable maps short byte strings (vocabulary entries, pre-token words) to a 64-bit payload;
// PairTable maps a pair of token ids to the id of their concatenation. Both are flat arrays of
// slots with linear probing, so a lookup is a hash plus one or two cache lines, and neither
// allocates per insert: keys live in one growing arena. std::unordered_map was 2-3x slower here.
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace keel::data::internal {

inline uint64_t HashBytes(std::string_view s) { return XXH3_64bits(s.data(), s.size()); }

class BytesTable {
 public:
  explicit BytesTable(size_t capacity_pow2 = 1 << 16) { Reset(capacity_pow2); }

  void Reset(size_t capacity_pow2) {
    slots_.assign(capacity_pow2, Slot{});
    mask_ = capacity_pow2 - 1;
    arena_.clear();
    size_ = 0;
  }
  void Clear() { Reset(slots_.size()); }

  size_t size() const { return size_; }
  size_t arena_bytes() const { return arena_.size(); }

  // Returns a pointer to the payload, or nullptr. `hash` must be HashBytes(key).
  const uint64_t* Find(std::string_view key, uint64_t hash) const {
    for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.len == kEmpty) return nullptr;
      if (s.hash == hash && s.len == key.size() &&
          std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0) {
        return &s.value;
      }
    }
  }

  // Inserts or overwrites. Grows at 50% load so probe chains stay short.
  void Insert(std::string_view key, uint64_t hash, uint64_t value) {
    if (2 * (size_ + 1) > slots_.size()) Grow();
    for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.len == kEmpty) {
        s.hash = hash;
        s.offset = static_cast<uint32_t>(arena_.size());
        s.len = static_cast<uint32_t>(key.size());
        s.value = value;
        arena_.append(key);
        ++size_;
        return;
      }
      if (s.hash == hash && s.len == key.size() &&
          std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0) {
        s.value = value;
        return;
      }
    }
  }

 private:
  static constexpr uint32_t kEmpty = 0xffffffffu;
  struct Slot {
    uint64_t hash = 0;
    uint64_t value = 0;
    uint32_t offset = 0;
    uint32_t len = kEmpty;
  };

  void Grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.size() * 2, Slot{});
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.len == kEmpty) continue;
      size_t i = s.hash & mask_;
      while (slots_[i].len != kEmpty) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
  std::string arena_;
};

class PairTable {
 public:
  static constexpr int32_t kNone = -1;

  void Build(size_t n_entries) {
    size_t cap = 16;
    while (cap < 2 * n_entries) cap *= 2;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
  }

  void Insert(int32_t a, int32_t b, int32_t merged) {
    uint64_t key = Key(a, b);
    for (size_t i = Mix(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].merged == kNone || slots_[i].key == key) {
        slots_[i] = Slot{key, merged};
        return;
      }
    }
  }

  // The id of bytes(a) + bytes(b) if that is a token, else kNone.
  int32_t Find(int32_t a, int32_t b) const {
    uint64_t key = Key(a, b);
    for (size_t i = Mix(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.merged == kNone) return kNone;
      if (s.key == key) return s.merged;
    }
  }

 private:
  struct Slot {
    uint64_t key = 0;
    int32_t merged = kNone;
  };
  static uint64_t Key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint64_t(uint32_t(b));
  }
  // Fibonacci hashing: the high bits of the product are well mixed; fold them down.
  static uint64_t Mix(uint64_t key) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

}  // namespace keel::data::internal
