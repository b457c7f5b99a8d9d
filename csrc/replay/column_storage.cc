// Column storage for replay. See column_storage.h for the layout and keys.
#include "replay/column_storage.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>

namespace zrl {
namespace {

inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

// How far ahead the gather prefetches: enough to cover a DRAM miss with the
// copies in between, few enough to stay inside the line-fill buffers.
constexpr std::size_t kPrefetchAhead = 12;

// Gathers items of a size known at compile time, so the copy is a couple of
// moves instead of a call to memcpy.
template <std::size_t kBytes>
void gather_fixed(const uint8_t* src, const int64_t* slots, std::size_t n, uint8_t* dst) {
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kPrefetchAhead < n) prefetch(src + slots[i + kPrefetchAhead] * kBytes);
    std::memcpy(dst + i * kBytes, src + slots[i] * kBytes, kBytes);
  }
}

void gather_any(const uint8_t* src, std::size_t bytes, const int64_t* slots, std::size_t n,
                uint8_t* dst) {
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kPrefetchAhead < n) prefetch(src + slots[i + kPrefetchAhead] * bytes);
    std::memcpy(dst + i * bytes, src + slots[i] * bytes, bytes);
  }
}

}  // namespace

std::size_t dtype_itemsize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kUInt8:
      return 1;
    case DType::kInt64:
      return 8;
    case DType::kBool:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt64:
      return "int64";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  if (name == "float32") return DType::kFloat32;
  if (name == "uint8") return DType::kUInt8;
  if (name == "int64") return DType::kInt64;
  if (name == "bool") return DType::kBool;
  throw std::invalid_argument("dtype: expected float32, uint8, int64 or bool, got '" + name + "'");
}

std::size_t FieldSpec::num_elements() const {
  std::size_t n = 1;
  for (int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

ColumnStorage::ColumnStorage(std::size_t capacity, std::vector<FieldSpec> fields)
    : capacity_(capacity), fields_(std::move(fields)) {
  if (capacity_ == 0) throw std::invalid_argument("capacity: must be positive");
  if (fields_.empty()) throw std::invalid_argument("fields: at least one field is needed");
  std::set<std::string> names;
  for (const FieldSpec& f : fields_) {
    if (f.name.empty()) throw std::invalid_argument("fields: a field name is empty");
    if (!names.insert(f.name).second)
      throw std::invalid_argument("fields: the name '" + f.name + "' is repeated");
    std::size_t bytes = dtype_itemsize(f.dtype);
    for (int64_t d : f.shape) {
      if (d <= 0)
        throw std::invalid_argument("fields['" + f.name + "']: every dimension must be > 0");
      if (bytes > std::numeric_limits<std::size_t>::max() / static_cast<std::size_t>(d))
        throw std::invalid_argument("fields['" + f.name + "']: the item size overflows");
      bytes *= static_cast<std::size_t>(d);
    }
    if (bytes > std::numeric_limits<std::size_t>::max() / 2 / capacity_)
      throw std::invalid_argument("capacity: capacity * item size of '" + f.name + "' overflows");
    item_bytes_.push_back(bytes);
  }
  if (capacity_ > kMaxCapacity)
    throw std::invalid_argument("capacity: at most 2^32 (keys hold the slot in 32 bits)");
  // Columns are left unwritten: pages are faulted in as the buffer fills.
  for (std::size_t bytes : item_bytes_) columns_.emplace_back(capacity_ * bytes);
  generations_ = AlignedArray<int64_t>(capacity_, 0);
  slot_rows_.push_back({generations_.data(), sizeof(int64_t)});
  for (std::size_t f = 0; f < fields_.size(); ++f)
    slot_rows_.push_back({columns_[f].data(), item_bytes_[f]});
}

void ColumnStorage::write(const void* const* columns, std::size_t row, std::size_t n) {
  if (n > capacity_ - cursor_) throw std::out_of_range("write: past the end of the storage");
  for (std::size_t f = 0; f < fields_.size(); ++f) {
    const std::size_t bytes = item_bytes_[f];
    std::memcpy(columns_[f].data() + cursor_ * bytes,
                static_cast<const uint8_t*>(columns[f]) + row * bytes, n * bytes);
  }
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t slot = cursor_ + i;
    // A slot below size_ already holds an item, which this write evicts.
    if (slot < size_) ++generations_[slot];
  }
  cursor_ += n;
  if (cursor_ > size_) size_ = cursor_;
  if (cursor_ == capacity_) cursor_ = 0;
}

void ColumnStorage::gather(const int64_t* slots, std::size_t n, void* const* out) const {
  for (std::size_t f = 0; f < fields_.size(); ++f) {
    const uint8_t* src = columns_[f].data();
    uint8_t* dst = static_cast<uint8_t*>(out[f]);
    switch (item_bytes_[f]) {
      case 1:
        gather_fixed<1>(src, slots, n, dst);
        break;
      case 4:
        gather_fixed<4>(src, slots, n, dst);
        break;
      case 8:
        gather_fixed<8>(src, slots, n, dst);
        break;
      case 16:
        gather_fixed<16>(src, slots, n, dst);
        break;
      case 32:
        gather_fixed<32>(src, slots, n, dst);
        break;
      default:
        gather_any(src, item_bytes_[f], slots, n, dst);
        break;
    }
  }
}

int64_t ColumnStorage::slot_of(int64_t key) const {
  if (key >= 0) {
    const int64_t slot = key & 0xFFFFFFFF, generation = key >> 32;
    if (static_cast<std::size_t>(slot) < size_) {
      const int64_t current = generations_[slot] & kGenerationMask;
      if (generation == current) return slot;
      // Older: stale. Newer: never issued, unless the slot's counter has passed 2^31 and
      // its 31 bits wrapped (then a "newer" key is an older one: stale too).
      if (generation < current || generations_[slot] > kGenerationMask) return -1;
    }
  }
  throw std::invalid_argument("keys: " + std::to_string(key) +
                              " is not a key this buffer has issued");
}

StorageState ColumnStorage::export_state() const {
  StorageState state;
  state.size = size_;
  state.cursor = cursor_;
  for (std::size_t f = 0; f < fields_.size(); ++f) {
    const uint8_t* begin = columns_[f].data();
    state.columns.emplace_back(begin, begin + size_ * item_bytes_[f]);
  }
  state.generations.assign(generations_.data(), generations_.data() + size_);
  return state;
}

void ColumnStorage::validate(const StorageStateView& state) const {
  if (state.size > capacity_)
    throw std::invalid_argument("state: size " + std::to_string(state.size) +
                                " exceeds the capacity " + std::to_string(capacity_));
  const bool full = state.size == capacity_;
  if (full ? state.cursor >= capacity_ : state.cursor != state.size)
    throw std::invalid_argument("state: cursor " + std::to_string(state.cursor) +
                                " is not where FIFO filling of " + std::to_string(state.size) +
                                " items leaves it");
  if (state.columns.size() != fields_.size())
    throw std::invalid_argument("state: expected " + std::to_string(fields_.size()) +
                                " columns, got " + std::to_string(state.columns.size()));
  if (state.size == 0) return;
  if (state.generations == nullptr) throw std::invalid_argument("state: generations missing");
  // FIFO leaves generation g + 1 on the slots before the cursor and g from the
  // cursor on (g = 0 and nothing wrapped yet when the buffer is not full).
  const int64_t g = state.generations[state.size - 1];
  if (g < 0 || g == INT64_MAX)  // (g + 1 below must not overflow)
    throw std::invalid_argument("state: generations are not the pattern FIFO leaves (slot " +
                                std::to_string(state.size - 1) + ")");
  for (std::size_t s = 0; s < state.size; ++s) {
    const int64_t want = s < state.cursor && full ? g + 1 : g;
    if (state.generations[s] != want || (!full && state.generations[s] != 0) || want < 0)
      throw std::invalid_argument("state: generations are not the pattern FIFO leaves (slot " +
                                  std::to_string(s) + ")");
  }
}

void ColumnStorage::import_state(const StorageStateView& state) {
  validate(state);
  for (std::size_t f = 0; f < fields_.size(); ++f)
    if (state.size) std::memcpy(columns_[f].data(), state.columns[f], state.size * item_bytes_[f]);
  std::fill(generations_.data(), generations_.data() + capacity_, int64_t{0});
  if (state.size) std::copy(state.generations, state.generations + state.size, generations_.data());
  size_ = state.size;
  cursor_ = state.cursor;
}

}  // namespace zrl
