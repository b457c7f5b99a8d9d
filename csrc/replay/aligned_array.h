// A fixed-size array of trivially copyable T, cache-line aligned, on huge
// pages where the system offers them.
//
// Unlike std::vector it does not touch its memory on construction unless
// asked to: a replay buffer of 1.4 GB should cost page faults as it fills,
// not a memset of every page up front. Tree levels ask for a fill value.
//
// Arrays of 2 MB or more are aligned to 2 MB and advised as huge pages
// (Linux, madvise mode of transparent huge pages, as numpy does for its big
// arrays): replay reads rows at random over tens of megabytes, where 4 kB
// pages would cost a TLB miss on nearly every row, and filling 1.4 GB takes
// 700 page faults instead of 350,000. The advice is only advice: without it
// the array works the same.
#pragma once

#include <cstddef>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace zrl {

inline constexpr std::size_t kCacheLine = 64;
inline constexpr std::size_t kHugePage = std::size_t{2} << 20;

template <typename T>
class AlignedArray {
  static_assert(std::is_trivially_copyable_v<T>, "AlignedArray holds plain data only");

 public:
  AlignedArray() = default;
  explicit AlignedArray(std::size_t n) : size_(n) {
    if (n == 0) return;
    const std::size_t bytes = n * sizeof(T);
    align_ = bytes >= kHugePage ? kHugePage : kCacheLine;
    data_ = static_cast<T*>(::operator new(bytes, std::align_val_t{align_}));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    // Whole huge pages inside the array only; failure is harmless.
    if (align_ == kHugePage) madvise(data_, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);
#endif
  }
  AlignedArray(std::size_t n, T fill) : AlignedArray(n) {
    for (std::size_t i = 0; i < n; ++i) data_[i] = fill;
  }
  AlignedArray(const AlignedArray&) = delete;
  AlignedArray& operator=(const AlignedArray&) = delete;
  AlignedArray(AlignedArray&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        align_(other.align_) {}
  AlignedArray& operator=(AlignedArray&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      align_ = other.align_;
    }
    return *this;
  }
  ~AlignedArray() { release(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  void release() {
    if (data_) ::operator delete(data_, std::align_val_t{align_});
    data_ = nullptr;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t align_ = kCacheLine;
};

}  // namespace zrl
