// Preallocated column storage for replay: one contiguous array per field,
// [capacity, *shape] raw bytes each, filled first-in first-out.
//
// A field is declared once (name, shape, dtype) and stored as raw bytes of
// prod(shape) * itemsize per item; the storage never interprets them. Slots
// are written in order 0, 1, ..., capacity - 1, 0, 1, ... (FIFO eviction).
//
// Generations and keys. Every slot carries a generation counter: 0 when the
// slot is first written, bumped each time it is overwritten. A key names one
// stored item as (generation << 32) | slot, a non-negative int64 (shifts,
// not a division by the capacity, so decoding 512 keys costs nothing). A key
// whose generation is older than its slot's is stale: that item has been
// evicted. This is what makes a learner's late update_priorities harmless.
// The key keeps 31 bits of generation: after 2^31 overwrites of one slot
// (2^31 * capacity additions) generations wrap, and only a key that old could
// be mistaken for a current one; once a slot's counter has wrapped, a key with
// a "newer" generation is an older one, stale like the rest (before, it is a
// key this storage never issued: an error).
//
// Concurrency: none inside; the owning buffer serialises every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "replay/aligned_array.h"
#include "replay/sum_min_tree.h"

namespace zrl {

enum class DType : uint8_t { kFloat32, kUInt8, kInt64, kBool };

std::size_t dtype_itemsize(DType dtype);
const char* dtype_name(DType dtype);
// "float32", "uint8", "int64" or "bool"; throws std::invalid_argument otherwise.
DType dtype_from_name(const std::string& name);

struct FieldSpec {
  std::string name;
  std::vector<int64_t> shape;  // empty for a scalar; every dimension > 0
  DType dtype = DType::kFloat32;

  std::size_t num_elements() const;
  std::size_t item_bytes() const { return num_elements() * dtype_itemsize(dtype); }
};

// What a buffer's state looks like when exported for a checkpoint: items in
// slot order, only the first `size` slots (FIFO fills slots in order, so
// these are all the stored items).
struct StorageState {
  std::size_t size = 0;
  std::size_t cursor = 0;
  std::vector<std::vector<uint8_t>> columns;  // per field: size * item_bytes bytes
  std::vector<int64_t> generations;           // [size]
};

// The same, borrowed from the caller (no copy) for an import.
struct StorageStateView {
  std::size_t size = 0;
  std::size_t cursor = 0;
  std::vector<const void*> columns;      // per field: size * item_bytes bytes
  const int64_t* generations = nullptr;  // [size]
};

class ColumnStorage {
 public:
  // Throws std::invalid_argument naming the problem: capacity 0, no fields,
  // an empty or repeated name, a dimension <= 0, or a size that overflows.
  ColumnStorage(std::size_t capacity, std::vector<FieldSpec> fields);

  std::size_t capacity() const { return capacity_; }
  std::size_t size() const { return size_; }
  std::size_t cursor() const { return cursor_; }  // the slot the next item goes to
  const std::vector<FieldSpec>& fields() const { return fields_; }

  // Copies items [row, row + n) of every column into slots [cursor, cursor + n)
  // and advances the cursor; n <= capacity - cursor (the caller splits at the
  // wrap). columns[f] points at the first of the caller's items of field f.
  void write(const void* const* columns, std::size_t row, std::size_t n);

  // out[f][i] = the item of field f in slots[i], for i in [0, n). Slots must
  // be < size(). Prefetches ahead, since sampled slots are scattered.
  void gather(const int64_t* slots, std::size_t n, void* const* out) const;
  // Every per-slot array a sample reads (the fields and the generations), as
  // SumMinTree::find_many's prefetch targets.
  const std::vector<SumMinTree::SlotRows>& slot_rows() const { return slot_rows_; }

  static constexpr std::size_t kMaxCapacity = std::size_t{1} << 32;
  static constexpr int64_t kGenerationMask = (int64_t{1} << 31) - 1;

  int64_t key_of(std::size_t slot) const {
    return ((generations_[slot] & kGenerationMask) << 32) | static_cast<int64_t>(slot);
  }
  // The slot a key names, or -1 when that item has been overwritten since.
  // Throws std::invalid_argument for a key this storage never issued.
  int64_t slot_of(int64_t key) const;

  StorageState export_state() const;
  // Throws std::invalid_argument, changing nothing, unless the state could
  // have come from this storage: size <= capacity, the FIFO cursor, and the
  // generation pattern FIFO leaves (all 0 until the first wrap; then g + 1
  // before the cursor and g from it on).
  void validate(const StorageStateView& state) const;
  void import_state(const StorageStateView& state);  // validates first

 private:
  std::size_t capacity_;
  std::vector<FieldSpec> fields_;
  std::vector<std::size_t> item_bytes_;
  std::vector<AlignedArray<uint8_t>> columns_;
  AlignedArray<int64_t> generations_;
  std::size_t size_ = 0;
  std::size_t cursor_ = 0;
  std::vector<SumMinTree::SlotRows> slot_rows_;
};

}  // namespace zrl
