#include "replay/batch_layout.h"

namespace zrl {

BatchLayout batch_layout(const std::vector<FieldSpec>& fields, std::size_t n) {
  BatchLayout layout;
  layout.offsets.reserve(fields.size());
  for (const FieldSpec& f : fields) {
    layout.offsets.push_back(layout.bytes);
    layout.bytes += (n * f.item_bytes() + kBatchAlign - 1) / kBatchAlign * kBatchAlign;
  }
  return layout;
}

}  // namespace zrl
