// The kernels PyTorch's own code serves for tpu: the views' geometry (CPU's kernels) and the
// scaled_dot_product_attention choice stub. Registration only: nothing to declare.

#include <ATen/Context.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/squeeze_native.h>
#include <ATen/ops/t_native.h>
#include <ATen/ops/transpose_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/unsqueeze_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/library.h>

#include <bit>
#include <cmath>
#include <mutex>
#include <string>
#include <unordered_map>

namespace {

// scaled_dot_product_attention asks this stub which kernel runs; the answer is the tpu kernel of
// aten::_fused_sdp_choice, in Python (ops/nn.py). That kernel answers from the operands' metadata
// and the user's backend switches alone, so its answer is kept per such key: an attention
// call asks Python (~10 us through the dispatcher) once per geometry. Under a Python dispatch mode
// the op is dispatched every time, as the mode expects to see it; symbolic sizes are not keyed.
std::mutex g_sdp_choices_mutex;
std::unordered_map<std::string, int64_t> g_sdp_choices;
constexpr size_t kSdpChoicesKept = 1024;

void appendWord(std::string& key, int64_t word) {
  key.append(reinterpret_cast<const char*>(&word), sizeof word);
}

bool appendSdpKey(std::string& key, const at::Tensor& t) {
  const auto word = [&key](int64_t v) { appendWord(key, v); };
  word(t.defined());
  if (!t.defined()) {
    return true;
  }
  if (t.is_nested() || t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return false;
  }
  word(static_cast<int64_t>(t.scalar_type()));
  word(t.device().index());
  word(t.requires_grad());
  word(t.dim());
  for (const auto size : t.sizes()) {
    word(size);
  }
  for (const auto stride : t.strides()) {
    word(stride);
  }
  return true;
}

int64_t fusedSdpChoice(
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask,
    double dropout_p,
    bool is_causal,
    std::optional<double> scale,
    bool enable_gqa) {
  const auto ask = [&] {
    return at::_ops::_fused_sdp_choice::call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
  };
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) {
    return ask();
  }
  std::string memo;
  memo.reserve(256);
  const at::Tensor none;
  for (const auto* t : {&query, &key, &value, attn_mask.has_value() ? &*attn_mask : &none}) {
    if (!appendSdpKey(memo, *t)) {
      return ask();
    }
  }
  const double scale_value = scale.value_or(std::nan(""));
  const auto& context = at::globalContext();  // (every backend switch: the rule may read any)
  const int64_t flags = (is_causal ? 1 : 0) | (enable_gqa ? 2 : 0) | (scale.has_value() ? 4 : 0) |
      (context.userEnabledOverrideableSDP() ? 8 : 0) | (context.userEnabledMathSDP() ? 16 : 0) |
      (context.userEnabledFlashSDP() ? 32 : 0) | (context.userEnabledMemEfficientSDP() ? 64 : 0) |
      (context.userEnabledCuDNNSDP() ? 128 : 0);
  appendWord(memo, std::bit_cast<int64_t>(dropout_p));
  appendWord(memo, std::bit_cast<int64_t>(scale_value));
  appendWord(memo, flags);
  {
    std::lock_guard<std::mutex> lock(g_sdp_choices_mutex);
    const auto found = g_sdp_choices.find(memo);
    if (found != g_sdp_choices.end()) {
      return found->second;
    }
  }
  const int64_t choice = ask();  // (outside the lock: Python runs, maybe on another thread too)
  std::lock_guard<std::mutex> lock(g_sdp_choices_mutex);
  if (g_sdp_choices.size() >= kSdpChoicesKept) {
    g_sdp_choices.clear();
  }
  g_sdp_choices.emplace(std::move(memo), choice);
  return choice;
}

}  // namespace

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &fusedSdpChoice)
}  // namespace at::native

// The views whose geometry a backend computes (the others are composites over these), with CPU's
// kernels; Python registers its own (ops/core.py) only for those not registered here. The
// in-place ones have composite kernels, but those would not be reached: they stay listed here so
// that both builds serve the same set.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("squeeze_", static_cast<at::Tensor& (*)(at::Tensor&)>(&at::native::squeeze_));
  m.impl("squeeze_.dim", static_cast<at::Tensor& (*)(at::Tensor&, int64_t)>(&at::native::squeeze_));
  m.impl("squeeze_.dims", static_cast<at::Tensor& (*)(at::Tensor&, at::IntArrayRef)>(&at::native::squeeze_));
  m.impl("unsqueeze_", TORCH_FN(at::native::unsqueeze_));
  m.impl("transpose_", TORCH_FN(at::native::transpose_));
  m.impl("t_", TORCH_FN(at::native::t_));
}
