#include "TpuGenerator.h"

#include <deque>
#include <mutex>

namespace torch_tpu {

namespace {

std::mutex g_generators_mutex;
std::deque<at::Generator> g_default_generators;  // a deque: references stay valid as it grows

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  index = resolve(index);
  check_index(index);
  std::lock_guard<std::mutex> lock(g_generators_mutex);
  while (g_default_generators.size() <= static_cast<size_t>(index)) {
    g_default_generators.push_back(
        at::make_generator<TpuGenerator>(static_cast<c10::DeviceIndex>(g_default_generators.size())));
  }
  return g_default_generators[index];
}

std::pair<uint64_t, uint64_t> draw(at::Generator generator, uint64_t count) {
  auto* impl = at::check_generator<TpuGenerator>(generator);
  std::lock_guard<std::mutex> lock(generator.mutex());
  const uint64_t offset = impl->get_offset();
  impl->set_offset(offset + count);
  return {impl->current_seed(), offset};
}

}  // namespace torch_tpu
