// tpu random generators (c10::GeneratorImpl, TpuGenerator.cpp).
#pragma once

#include "TpuFunctions.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <cstring>
#include <utility>

namespace torch_tpu {

// ----------------------------------------------------------------------------- generators
// A tpu generator is a seed and a counter (torch_tpu.runtime.random derives one JAX key per
// random op from them); its state is the two as int64s, 16 bytes.
struct TpuGenerator final : c10::GeneratorImpl {
  uint64_t seed_ = c10::default_rng_seed_val;
  uint64_t offset_ = 0;

  explicit TpuGenerator(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(kTpu, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  static c10::DeviceType device_type() {
    return kTpu;
  }
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t current_seed() const override {
    return seed_;
  }
  uint64_t seed() override {
    set_current_seed(c10::detail::getNonDeterministicRandom());
    return seed_;
  }
  void set_offset(uint64_t offset) override {
    offset_ = offset;
  }
  uint64_t get_offset() const override {
    return offset_;
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto state = at::detail::empty_cpu({2 * sizeof(uint64_t)}, at::kByte);
    const uint64_t words[2] = {seed_, offset_};
    std::memcpy(state.mutable_data_ptr(), words, sizeof(words));
    return state.getIntrusivePtr();
  }
  void set_state(const c10::TensorImpl& state) override {
    at::detail::check_rng_state(state);
    TORCH_CHECK(
        state.numel() == 2 * sizeof(uint64_t),
        "tpu RNG state must be a uint8 tensor of 16 bytes (from get_rng_state()), got ", state.numel());
    uint64_t words[2];
    std::memcpy(words, state.data(), sizeof(words));
    seed_ = words[0];
    offset_ = words[1];
  }

 private:
  TpuGenerator* clone_impl() const override {
    auto* copy = new TpuGenerator(device().index());
    copy->seed_ = seed_;
    copy->offset_ = offset_;
    return copy;
  }
};

// tpu:index's default generator (the current device's for a negative index), made at first use.
const at::Generator& default_generator(c10::DeviceIndex index);

// Take `count` consecutive counter values from a tpu generator: (seed, first offset).
std::pair<uint64_t, uint64_t> draw(at::Generator generator, uint64_t count);

}  // namespace torch_tpu
