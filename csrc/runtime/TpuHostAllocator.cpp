#include "TpuHostAllocator.h"

#include <c10/core/impl/alloc_cpu.h>

#include <iterator>
#include <map>
#include <mutex>

namespace torch_tpu {

namespace {

// ----------------------------------------------------------------------------- pinned memory
// Host memory that is_pinned() recognizes. PJRT stages host buffers itself, so pinning buys no
// transfer speed today; it gives PyTorch code (DataLoader, FSDP offload) the semantics it checks.
struct PinnedAllocator final : c10::Allocator {
  std::mutex mutex;
  std::map<const char*, size_t> blocks;  // start -> size of each live block

  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (data) {
      std::lock_guard<std::mutex> lock(mutex);
      blocks.emplace(static_cast<const char*>(data), nbytes);
    }
    return {data, data, &free_block, c10::Device(c10::DeviceType::CPU)};
  }
  static void free_block(void* data);
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_block;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  bool contains(const void* ptr) {
    const auto* p = static_cast<const char*>(ptr);
    std::lock_guard<std::mutex> lock(mutex);
    auto it = blocks.upper_bound(p);
    return it != blocks.begin() && p < std::prev(it)->first + std::prev(it)->second;
  }
};

PinnedAllocator g_pinned;

void PinnedAllocator::free_block(void* data) {
  {
    std::lock_guard<std::mutex> lock(g_pinned.mutex);
    g_pinned.blocks.erase(static_cast<const char*>(data));
  }
  c10::free_cpu(data);
}

}  // namespace

c10::Allocator* host_allocator() {
  return &g_pinned;
}

bool is_pinned(const void* data) {
  return g_pinned.contains(data);
}

}  // namespace torch_tpu
