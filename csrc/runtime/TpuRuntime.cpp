// torch_tpu's C++ runtime core: the PrivateUse1 interfaces PyTorch offers no Python route to.
//
// - hooks (at::PrivateUse1HooksInterface): generators, the pinned host allocator, storage
//   resize, the device count;
// - the device guard: current device, one in-order stream, events, device synchronization;
// - the device allocator (c10::DeviceAllocator): a unique handle per storage and memory stats;
// - the view kernels: a view only computes sizes, strides and offset over the same storage, the
//   same work CPU's kernels do, so PrivateUse1 runs those kernels instead of a Python round trip;
// - the two storage-value calls of every op: reading the value of a tensor that is its whole
//   storage, and attaching an op's result to a new tensor (each one call instead of a dozen
//   Python-level ones; every other case answers None and Python handles it);
// - planned kernels: an op's calls that repeat a plan its Python kernel kept (the same program
//   on the same kinds of arguments) run from here with no Python frame; every other call goes to
//   the Python kernel, which decides everything;
// - with FusedRecord.cpp: a fused graph's node that repeats the one at its place in the last
//   graph recorded without Graph.record's Python (a training or decoding loop's every node).
//
// Everything Python can decide stays in Python: synchronization, what a storage resize does to
// the JAX buffer behind it, memory statistics and the device count come from callbacks on the
// object given to install() (torch_tpu.runtime.native). A tpu storage's bytes live in a JAX
// array attached to its Python object, so the "pointer" of a storage is only a handle: unique
// while it lives, never dereferenced, taken from an address range no host pointer uses.

#include <ATen/EmptyTensor.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/transformers/attention.h>
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
#include <ATen/ops/_fused_sdp_choice_ops.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <structmember.h>

#include "FusedRecord.h"

#include <algorithm>
#include <array>
#include <bit>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <type_traits>
#include <unordered_map>

namespace py = pybind11;

namespace {

constexpr auto kTpu = c10::DeviceType::PrivateUse1;

// ----------------------------------------------------------------------------- Python side
PyObject* g_callbacks = nullptr;  // torch_tpu.runtime.native; kept for the process's lifetime
std::atomic<int> g_device_count{0};
thread_local c10::DeviceIndex g_current_device = 0;

// Calls torch_tpu.runtime.native.<name>(args) and converts its result to R, under the GIL
// (PyTorch calls some of these with the GIL released).
template <typename R = void, typename... Args>
R callback(const char* name, Args&&... args) {
  py::gil_scoped_acquire gil;
  py::object result = py::handle(g_callbacks).attr(name)(std::forward<Args>(args)...);
  if constexpr (!std::is_void_v<R>) {
    return result.cast<R>();
  }
}

void check_index(c10::DeviceIndex index) {
  // The wording of CUDA's error for the same request ("invalid device ordinal"), naming the
  // devices that do exist; torch_tpu.device uses the same sentence.
  const int count = g_device_count;
  TORCH_CHECK(
      index >= 0 && index < count,
      "tpu error: invalid device ordinal: tpu:", static_cast<int>(index), " (this process drives ",
      count, count == 1 ? " device, tpu:0" : " devices, tpu:0 to tpu:" + std::to_string(count - 1),
      "; launch one process per device)");
}

c10::DeviceIndex resolve(c10::DeviceIndex index) {
  return index < 0 ? g_current_device : index;
}

// The first time a device other than tpu:0 becomes current, Python is told (it keeps tpu:0's
// paths free of device bookkeeping until then).
std::atomic<bool> g_told_other_device{false};

void set_current(c10::DeviceIndex index) {
  if (index > 0 && !g_told_other_device.exchange(true)) {
    callback("device_used", index);
  }
  g_current_device = index;
}

void synchronize(c10::DeviceIndex index) {
  callback("synchronize", resolve(index));
}

// ----------------------------------------------------------------------------- device allocator
// Handles start at 2^62: above any user-space address on x86-64 and AArch64 (a stray host read
// faults instead of reading unrelated memory), below 2^63 (they stay positive as int64).
constexpr uintptr_t kHandleBase = uintptr_t{1} << 62;
constexpr uintptr_t kAlignment = 512;

void release_handle(void*) {}

// torch.profiler's profile_memory=True: an allocation made while the profiler records memory
// reports its size then and at its release (the context it carries says how much); the others
// cost nothing. The total reported is the live bytes of those allocations.
struct Reported {
  void* handle;
  size_t bytes;
  c10::Device device;
};
std::atomic<int64_t> g_reported_bytes{0};

void report(const Reported& allocation, int64_t change) {
  const auto total = static_cast<size_t>(g_reported_bytes.fetch_add(change) + change);
  c10::reportMemoryUsageToProfiler(allocation.handle, change, total, total, allocation.device);
}

void release_reported(void* context) {
  std::unique_ptr<Reported> allocation(static_cast<Reported*>(context));
  report(*allocation, -static_cast<int64_t>(allocation->bytes));
}

struct TpuAllocator final : c10::DeviceAllocator {
  std::atomic<uintptr_t> next{kHandleBase};

  c10::DataPtr allocate(size_t nbytes) override {
    const c10::Device device(kTpu, g_current_device);
    if (nbytes == 0) {
      return {nullptr, nullptr, &release_handle, device};  // as CPU: an empty storage is null
    }
    // Handles are never reused and never overlap, like addresses of live allocations: a view's
    // data_ptr (handle + offset) cannot equal another storage's.
    const auto span = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
    void* handle = reinterpret_cast<void*>(next.fetch_add(span));
    if (c10::memoryProfilingEnabled()) {
      auto* allocation = new Reported{handle, span, device};
      report(*allocation, static_cast<int64_t>(span));
      return {handle, allocation, &release_reported, device};
    }
    return {handle, nullptr, &release_handle, device};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &release_handle;
  }
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, "tpu storages have no host bytes to copy: copy through tensors instead");
  }
  bool initialized() override {
    return true;
  }
  void emptyCache(c10::MempoolId_t) override {
    callback("empty_cache");
  }
  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // one stream
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex index) override {
    check_index(index);
    const auto values = callback<std::array<int64_t, 5>>("memory_stats", index);
    c10::CachingDeviceAllocator::DeviceStats stats;
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    stats.allocated_bytes[all].current = values[0];
    stats.allocated_bytes[all].peak = values[1];
    stats.reserved_bytes[all].current = values[2];
    stats.reserved_bytes[all].peak = values[3];
    stats.allocation[all].current = values[4];
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {}  // none are kept
  void resetPeakStats(c10::DeviceIndex index) override {
    check_index(index);
    callback("reset_peak_memory_stats", index);
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex index) override {
    check_index(index);
    return callback<std::pair<size_t, size_t>>("mem_get_info", index);
  }
};

TpuAllocator g_allocator;

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

std::mutex g_generators_mutex;
std::deque<at::Generator> g_default_generators;  // a deque: references stay valid as it grows

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

// ----------------------------------------------------------------------------- hooks
struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return g_device_count > 0;
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return callback<bool>("is_initialized");
  }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(g_device_count.load());
  }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    check_index(index);
    set_current(index);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return g_current_device;
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const auto old = g_current_device;
    setCurrentDevice(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    index = resolve(index);
    check_index(index);
    return at::make_generator<TpuGenerator>(index);
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return &g_pinned;
  }
  bool isPinnedPtr(const void* data) const override {
    return g_pinned.contains(data);
  }
  // storage.resize_(n) (FSDP2 frees and reallocates parameters this way). Python resizes the JAX
  // buffer (keeping the first bytes, as CPU does); the storage gets a new handle, as a CPU
  // storage gets a new allocation.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    {
      py::gil_scoped_acquire gil;  // (the Python storage object carries the JAX buffer)
      auto py_storage = py::reinterpret_steal<py::object>(THPStorage_Wrap(storage));
      callback("resize_storage", py_storage, nbytes);
    }
    auto* impl = storage.unsafeGetStorageImpl();
    auto data = g_allocator.allocate(nbytes);
    data.unsafe_set_device(storage.device());  // (the storage stays on its device)
    impl->set_data_ptr_noswap(std::move(data));
    impl->set_nbytes(nbytes);
  }
};

// ----------------------------------------------------------------------------- device guard
// XLA runs a device's work in order: there is one stream per device, and every stream PyTorch
// asks for is it. An event records by waiting for the work before it (as torch.tpu.Event does),
// so it is complete once recorded and its timestamp bounds that work.
struct TpuEvent {
  std::chrono::steady_clock::time_point at;
};

struct TpuGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kTpu;
  }
  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device old = getDevice();
    setDevice(device);
    return old;
  }
  c10::Device getDevice() const override {
    return {kTpu, g_current_device};
  }
  void setDevice(c10::Device device) const override {
    check_index(device.index());
    set_current(device.index());
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    // (only ever restores a device set before, so Python has already been told about it)
    if (device.index() >= 0 && device.index() < g_device_count) {
      g_current_device = device.index();
    }
  }
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kTpu, resolve(device.index())));
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return getStream(device);
  }
  c10::Stream getNewStream(c10::Device device, int) const override {
    return getStream(device);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool) const override {
    return getStream(device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const noexcept override {
    return stream;  // the only stream stays current
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(g_device_count.load());
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex, const c10::EventFlag)
      const override {
    synchronize(stream.device_index());
    if (*event == nullptr) {
      *event = new TpuEvent{};
    }
    static_cast<TpuEvent*>(*event)->at = std::chrono::steady_clock::now();
  }
  void block(void*, const c10::Stream&) const override {}  // one stream: already ordered
  bool queryEvent(void*) const override {
    return true;  // recording waited for the work
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<TpuEvent*>(event);
  }
  void synchronizeEvent(void*) const override {}  // recording waited for the work
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    // (c10::Event has checked that both were created with enable_timing=True)
    TORCH_CHECK(start && end, "Both events must be recorded before calculating elapsed time.");
    const auto elapsed = static_cast<TpuEvent*>(end)->at - static_cast<TpuEvent*>(start)->at;
    return std::chrono::duration<double, std::milli>(elapsed).count();
  }
  bool queryStream(const c10::Stream& stream) const override {
    synchronize(stream.device_index());
    return true;
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    synchronize(stream.device_index());
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    synchronize(index);
  }
};

// ----------------------------------------------------------------------------- Python entry points
// A tpu tensor on tpu:index whose storage has nbytes (a fresh handle) and this geometry; its value
// (an array on that device) is attached by Python.
at::Tensor empty(
    const std::vector<int64_t>& sizes,
    const std::optional<std::vector<int64_t>>& strides,
    c10::ScalarType dtype,
    size_t nbytes,
    c10::DeviceIndex index) {
  auto data = g_allocator.allocate(nbytes);
  data.unsafe_set_device(c10::Device(kTpu, index));
  c10::Storage storage(
      c10::Storage::use_byte_size_t{}, static_cast<int64_t>(nbytes), std::move(data), &g_allocator,
      /*resizable=*/true);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::scalarTypeToTypeMeta(dtype));
  if (strides) {
    tensor.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, *strides);
  } else {
    tensor.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  }
  return tensor;
}

// ----------------------------------------------------------------------------- storage values
// A tpu storage's value is an attribute of its Python object (torch_tpu.runtime.buffer): a JAX
// array, or a fused graph's Deferred output. Python names the attribute, the two types and the
// dtype correspondence once (configure_values); the objects are kept for the process's lifetime.
struct ValueTypes {
  PyObject* attr = nullptr;  // the storage attribute holding the value
  PyTypeObject* array = nullptr;  // jax's concrete array type
  PyTypeObject* deferred = nullptr;  // buffer.Deferred
  PyObject* strided_view = nullptr;  // buffer.StridedView
  PyObject* to_torch = nullptr;  // {numpy dtype: torch.dtype}
  // to_torch's entries by the dtype object's identity, tried before the dict: hashing a numpy
  // dtype costs a tenth of a microsecond, paid by every output otherwise
  c10::SmallVector<std::pair<PyObject*, c10::ScalarType>, 24> by_identity;
  std::array<PyObject*, static_cast<size_t>(c10::ScalarType::NumOptions)> to_jax{};
  // the attribute names read
  PyObject* aval = nullptr;
  PyObject* shape = nullptr;
  PyObject* dtype = nullptr;
  PyObject* value = nullptr;
  PyObject* committed = nullptr;
};
ValueTypes g_values;

void configure_values(
    py::str attr,
    py::handle array,
    py::handle deferred,
    py::handle strided_view,
    py::dict torch_to_jax,
    py::dict jax_to_torch) {
  TORCH_CHECK(
      PyType_Check(array.ptr()) && PyType_Check(deferred.ptr()) && PyType_Check(strided_view.ptr()),
      "configure_values takes three types");
  g_values.strided_view = strided_view.inc_ref().ptr();
  g_values.attr = attr.inc_ref().ptr();
  PyUnicode_InternInPlace(&g_values.attr);
  g_values.array = reinterpret_cast<PyTypeObject*>(array.inc_ref().ptr());
  g_values.deferred = reinterpret_cast<PyTypeObject*>(deferred.inc_ref().ptr());
  for (auto [torch_dtype, jax_dtype] : torch_to_jax) {
    TORCH_CHECK(THPDtype_Check(torch_dtype.ptr()), "configure_values: torch_to_jax's keys must be torch dtypes");
    auto scalar_type = reinterpret_cast<THPDtype*>(torch_dtype.ptr())->scalar_type;
    g_values.to_jax[static_cast<size_t>(scalar_type)] = jax_dtype.inc_ref().ptr();
  }
  for (auto [jax_dtype, torch_dtype] : jax_to_torch) {
    TORCH_CHECK(THPDtype_Check(torch_dtype.ptr()), "configure_values: jax_to_torch's values must be torch dtypes");
    g_values.by_identity.emplace_back(
        jax_dtype.inc_ref().ptr(), reinterpret_cast<THPDtype*>(torch_dtype.ptr())->scalar_type);
  }
  g_values.to_torch = jax_to_torch.inc_ref().ptr();
  g_values.aval = PyUnicode_InternFromString("aval");
  g_values.shape = PyUnicode_InternFromString("shape");
  g_values.dtype = PyUnicode_InternFromString("dtype");
  g_values.value = PyUnicode_InternFromString("value");
  g_values.committed = PyUnicode_InternFromString("_committed");
}

// The shape and dtype of a storage value that is a concrete array or a pending Deferred one;
// false for anything else (a graph's computed Deferred, an uninitialized storage, a tracer).
bool describe(PyObject* value, py::object& shape, py::object& dtype) {
  auto* type = Py_TYPE(value);
  py::handle handle(value);
  if (type == g_values.array) {
    auto aval = handle.attr(g_values.aval);
    shape = aval.attr(g_values.shape);
    dtype = aval.attr(g_values.dtype);
    return true;
  }
  if (type == g_values.deferred && handle.attr(g_values.value).is_none()) {
    shape = handle.attr(g_values.shape);
    dtype = handle.attr(g_values.dtype);
    return true;
  }
  return false;
}

bool same_sizes(const py::object& shape, c10::IntArrayRef sizes) {
  if (!PyTuple_Check(shape.ptr()) || PyTuple_GET_SIZE(shape.ptr()) != static_cast<Py_ssize_t>(sizes.size())) {
    return false;
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i)) != sizes[i]) {
      PyErr_Clear();  // (a dimension that is not an integer)
      return false;
    }
  }
  return true;
}

// The value of a tpu tensor's storage if the tensor reads it with its dtype (no lazy conjugate
// or negative bit) and the value is a concrete array or a pending Deferred one: its shape then
// comes back too. Else None: Python reads the tensor (tensor._view). A Deferred value whose
// graph has run is replaced by its array first, as buffer.get does: every storage a graph wrote
// stays on this path at its first read after the graph ran.
py::object storage_value(const at::Tensor& tensor, py::object& shape) {
  if (tensor.device().type() != kTpu || !tensor.has_storage() || tensor.is_conj() || tensor.is_neg()) {
    return py::none();
  }
  PyObject* wanted = g_values.to_jax[static_cast<size_t>(tensor.scalar_type())];
  if (wanted == nullptr) {  // a dtype tpu does not have: Python raises its error
    return py::none();
  }
  auto storage = py::reinterpret_steal<py::object>(THPStorage_Wrap(tensor.storage()));
  if (!storage) {
    throw py::error_already_set();
  }
  auto value = py::reinterpret_steal<py::object>(PyObject_GetAttr(storage.ptr(), g_values.attr));
  if (!value) {  // a storage without a value: Python raises its error
    PyErr_Clear();
    return py::none();
  }
  if (Py_TYPE(value.ptr()) == g_values.deferred) {
    py::object computed = value.attr(g_values.value);
    if (!computed.is_none()) {  // its graph has run: the storage keeps the array (buffer.get's rule)
      if (PyObject_SetAttr(storage.ptr(), g_values.attr, computed.ptr()) != 0) {
        throw py::error_already_set();
      }
      value = std::move(computed);
    }
  }
  py::object dtype;
  if (!describe(value.ptr(), shape, dtype) || dtype.ptr() != wanted || !PyTuple_Check(shape.ptr())) {
    return py::none();
  }
  return value;
}

// The value of a tpu tensor that is its whole storage in order (contiguous, of the value's
// shape: storage_value's conditions), else None: a view, a reinterpreted dtype or any other
// value, read by Python (tensor._view).
py::object whole_value(py::handle object) {
  if (g_values.attr == nullptr || !THPVariable_Check(object.ptr())) {
    return py::none();
  }
  const at::Tensor& tensor = THPVariable_Unpack(object.ptr());
  if (!tensor.is_contiguous() || tensor.storage_offset() != 0) {
    return py::none();
  }
  py::object shape;
  py::object value = storage_value(tensor, shape);
  if (value.is_none() || !same_sizes(shape, tensor.sizes())) {
    return py::none();
  }
  return value;
}

// A view's strides as its StridedView addresses the storage with them: those of size-1 dims,
// which address nothing, made row-major's (tensor._addressing_strides).
c10::SmallVector<int64_t, 6> addressing_strides(const at::Tensor& tensor) {
  const auto sizes = tensor.sizes();
  const auto strides = tensor.strides();
  c10::SmallVector<int64_t, 6> addressing(sizes.size());
  int64_t row_major = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    addressing[d] = sizes[d] == 1 ? row_major : strides[d];
    row_major *= sizes[d];
  }
  return addressing;
}

// StridedView(value, start, the tensor's shape, `addressing`), as tensor.read_in_program makes it.
py::object strided_view(py::handle value, py::handle start, c10::IntArrayRef sizes, c10::ArrayRef<int64_t> addressing) {
  const auto dims = static_cast<Py_ssize_t>(sizes.size());
  py::tuple view_shape(dims), view_strides(dims);
  for (Py_ssize_t d = 0; d < dims; ++d) {
    PyTuple_SET_ITEM(view_shape.ptr(), d, PyLong_FromLongLong(sizes[d]));
    PyTuple_SET_ITEM(view_strides.ptr(), d, PyLong_FromLongLong(addressing[d]));
  }
  return py::reinterpret_borrow<py::object>(g_values.strided_view)(value, start, view_shape, view_strides);
}

// A tpu tensor that is its whole storage value with axes permuted (w.t(), x.transpose(1, 2)) as
// the StridedView tensor.read_in_program makes of it: the value, no start, the tensor's shape
// and addressing strides. Else None. The rule is tensor._is_whole_permutation's; ops read such
// views in their own program.
py::object permuted_view(const at::Tensor& tensor) {
  const int64_t dims = tensor.dim();
  if (dims < 2 || tensor.is_contiguous() || tensor.storage_offset() != 0) {
    return py::none();
  }
  const auto sizes = tensor.sizes();
  const auto addressing = addressing_strides(tensor);
  std::vector<int64_t> order(dims);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return addressing[a] > addressing[b]; });
  int64_t expected = 1;
  bool permuted = false;
  for (int64_t k = dims - 1; k >= 0; --k) {
    const int64_t d = order[k];
    if (sizes[d] != 1 && addressing[d] != expected) {
      return py::none();  // not dense: a slice, a broadcast
    }
    expected *= sizes[d];
    permuted = permuted || d != k;
  }
  if (!permuted) {
    return py::none();
  }
  py::object shape;
  py::object value = storage_value(tensor, shape);
  if (value.is_none()) {
    return py::none();
  }
  int64_t count = 1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape.ptr()); ++i) {
    count *= PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
  }
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return py::none();
  }
  if (count != tensor.numel()) {
    return py::none();
  }
  return strided_view(value, py::none(), sizes, addressing);
}

// An op's positional arguments for the per-op fast path (ops/dispatch/kernel.py): a key of what binding
// and promotion depend on, one byte per argument, and the arguments with each whole tensor
// replaced by its whole value (whole_value) and, at the positions set in `views_read_in_program`
// (bit i: argument i), each whole storage with axes permuted by its StridedView
// (permuted_view); the others, kept, Python converts. A tensor's byte is its dtype and one of
// kTensorStates; anything else's, its type. Arguments of other dtypes, states, types or number
// give another key. None for more than 8 arguments.
enum TensorState : uint64_t { kView, kWhole, kZeroDimView, kZeroDimWhole, kPermuted, kTensorStates };
// Keys of what is not a tensor: kOtherKeys | 1 bool, 2 int, 3 float, 4 complex, 5 None, 6 list or
// tuple, 7 anything else.
constexpr uint64_t kOtherKeys = 0xF0;
static_assert(
    static_cast<uint64_t>(c10::ScalarType::NumOptions) * kTensorStates < kOtherKeys, "a tensor's key takes one byte");
py::object whole_operands(py::handle args, uint64_t views_read_in_program) {
  const Py_ssize_t count = PyTuple_GET_SIZE(args.ptr());
  if (count == 0 || count > 8) {
    return py::none();
  }
  uint64_t key = 0;
  py::tuple values(count);
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* item = PyTuple_GET_ITEM(args.ptr(), i);
    uint64_t code;
    py::object value;
    if (THPVariable_Check(item)) {
      const at::Tensor& tensor = THPVariable_Unpack(item);
      value = whole_value(item);
      uint64_t state = tensor.dim() == 0 ? kZeroDimView : kView;
      if (!value.is_none()) {
        state += 1;  // (the matching whole state)
      } else if (views_read_in_program >> i & 1) {
        value = permuted_view(tensor);
        state = value.is_none() ? state : kPermuted;
      }
      code = static_cast<uint64_t>(tensor.scalar_type()) * kTensorStates + state + 1;
      if (value.is_none()) {
        value = py::reinterpret_borrow<py::object>(item);
      }
    } else {
      code = kOtherKeys | (PyBool_Check(item)           ? 1
                           : PyLong_CheckExact(item)    ? 2
                           : PyFloat_CheckExact(item)   ? 3
                           : PyComplex_CheckExact(item) ? 4
                           : item == Py_None            ? 5
                           : (PyList_Check(item) || PyTuple_Check(item)) ? 6
                                                                          : 7);
      value = py::reinterpret_borrow<py::object>(item);
    }
    PyTuple_SET_ITEM(values.ptr(), i, value.release().ptr());
    key = key << 8 | code;
  }
  return py::make_tuple(key, std::move(values));
}

// A new contiguous tpu:0 tensor whose storage holds `value` (a committed array or a pending
// Deferred one, of a dtype tpu has), else an undefined tensor: Python wraps it (tensor.wrap).
at::Tensor value_tensor(py::handle value) {
  py::object shape, dtype;
  if (g_values.attr == nullptr || !describe(value.ptr(), shape, dtype) || !PyTuple_Check(shape.ptr())) {
    return {};
  }
  if (Py_TYPE(value.ptr()) == g_values.array && !PyObject_IsTrue(value.attr(g_values.committed).ptr())) {
    return {};  // put on the device first (buffer.put)
  }
  std::optional<c10::ScalarType> scalar_type;
  for (const auto& [jax_dtype, torch_type] : g_values.by_identity) {
    if (jax_dtype == dtype.ptr()) {
      scalar_type = torch_type;
      break;
    }
  }
  if (!scalar_type) {  // (an equal dtype object of another identity)
    PyObject* torch_dtype = PyDict_GetItemWithError(g_values.to_torch, dtype.ptr());
    if (torch_dtype == nullptr) {
      if (PyErr_Occurred()) {
        throw py::error_already_set();
      }
      return {};
    }
    scalar_type = reinterpret_cast<THPDtype*>(torch_dtype)->scalar_type;
  }
  std::vector<int64_t> sizes(PyTuple_GET_SIZE(shape.ptr()));
  int64_t count = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    sizes[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
    count *= sizes[i];
  }
  if (PyErr_Occurred()) {
    throw py::error_already_set();
  }
  auto tensor = empty(sizes, std::nullopt, *scalar_type, count * c10::elementSize(*scalar_type), 0);
  auto storage = py::reinterpret_steal<py::object>(THPStorage_Wrap(tensor.storage()));
  if (!storage || PyObject_SetAttr(storage.ptr(), g_values.attr, value.ptr()) != 0) {
    throw py::error_already_set();
  }
  return tensor;
}

// value_tensor's tensor as a Python object; None where Python wraps the value.
py::object wrap_value(py::handle value) {
  at::Tensor tensor = value_tensor(value);
  if (!tensor.defined()) {
    return py::none();
  }
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(tensor)));
}

// The functions every op calls, several times for some, as plain CPython functions: pybind11's
// call machinery would cost about as much as their work. `returning` runs one, turning a C++
// exception into a Python one.
template <class Fn>
PyObject* returning(Fn&& fn) {
  try {
    return fn().release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

template <py::object (*fn)(py::handle)>
PyObject* call_with_one(PyObject* /*module*/, PyObject* arg) {
  return returning([&] { return fn(arg); });
}

PyObject* call_whole_operands(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  if (count != 2 || !PyTuple_Check(args[0]) || !PyLong_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "whole_operands(args: tuple, views_read_in_program: int)");
    return nullptr;
  }
  const uint64_t positions = PyLong_AsUnsignedLongLong(args[1]);
  if (PyErr_Occurred()) {
    return nullptr;
  }
  return returning([&] { return whole_operands(args[0], positions); });
}

// Whether every tensor in the tuple `inputs` is contiguous (an elementwise op's output is then
// laid out contiguously too: tensor.wrap_elementwise's common case).
bool tensors_contiguous(PyObject* inputs) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(inputs); ++i) {
    PyObject* item = PyTuple_GET_ITEM(inputs, i);
    if (THPVariable_Check(item) && !THPVariable_Unpack(item).is_contiguous()) {
      return false;
    }
  }
  return true;
}

// wrap_value(value[, inputs]): with inputs (an elementwise op's arguments), only where every
// tensor among them is contiguous, the output's layout then (tensor.wrap_elementwise).
PyObject* call_wrap_value(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  if (count == 2) {
    if (!PyTuple_Check(args[1])) {
      PyErr_SetString(PyExc_TypeError, "wrap_value(value, inputs: tuple)");
      return nullptr;
    }
    if (!tensors_contiguous(args[1])) {
      Py_RETURN_NONE;
    }
  } else if (count != 1) {
    PyErr_SetString(PyExc_TypeError, "wrap_value(value[, inputs])");
    return nullptr;
  }
  return call_with_one<wrap_value>(nullptr, args[0]);
}

// ----------------------------------------------------------------------------- planned kernels
// A kernel the dispatcher calls (an op's tpu kernel, ops/dispatch/) that serves a call from a
// plan the op's Python kernel kept when every tensor argument was one the core reads whole
// (whole_operands: the key, the values) and every other one a static argument or a number
// (dispatch.plans.native_rules): the plan's program runs on those values and its output becomes the
// new tensor here, with no Python frame between the dispatcher and the program but a number's
// conversion (the op joins dispatch.recording.recorded_ops as there). A thread recording a fused graph
// records the program instead (its recorder's record, as the Python kernel calls it), and the
// pending output becomes the tensor the same way. Everything else goes to the Python kernel:
// keyword arguments, an unplanned key, launch blocking, a float32 matmul precision other than
// "highest", more than one device, a pending job, meta checks, and a program or recording that
// raises (the Python kernel runs the call again and raises PyTorch's error).
struct PlanState {
  PyObject* platform = nullptr;  // torch_tpu.runtime.platform's namespace
  PyObject* dispatch = nullptr;  // torch_tpu.ops.dispatch's
  PyObject* config = nullptr;  // torch_tpu.config's
  PyObject* context = nullptr;  // runtime.context.context, the thread's execution state
  PyObject* wrap = nullptr;  // tensor.wrap
  PyObject* wrap_elementwise = nullptr;  // tensor.wrap_elementwise
  PyObject* number = nullptr;  // dispatch.conversion.number: a Python number as the program's input
  PyObject* wrap_output = nullptr;  // dispatch.variants.wrap_output: one output of a tuple
  PyObject* write_whole = nullptr;  // tensor.write_whole: an in-place variant's store
  // names read
  PyObject* attention_needed = nullptr;
  PyObject* others_used = nullptr;
  PyObject* recorded_ops = nullptr;
  PyObject* check_meta = nullptr;
  PyObject* recorder = nullptr;
  PyObject* record = nullptr;
  PyObject* graph = nullptr;
  PyObject* launch_blocking = nullptr;
  PyObject* op = nullptr;
};
PlanState g_plans;
PyObject* g_zero = nullptr;  // 0, the tpu index numbers are converted for (one device in use)

struct PlannedKernel {
  PyObject_HEAD PyObject* kernel;  // the op's Python kernel
  // {key: a NativePlan (ops/dispatch/plans.py), read through PlanField}
  PyObject* plans;
  PyObject* op;  // the OpOverload (dispatch.recording.recorded_ops)
  PyObject* name;  // the op's name (context.op, named by errors of checks reported later)
  uint64_t views_read_in_program;  // as whole_operands takes it
  long returns;  // a Returns
};

// (dispatch.plans.NATIVE_STATIC, NATIVE_NUMBER, NATIVE_VIEW and NATIVE_INDICES)
enum NativeRule : long { kNativeStatic, kNativeNumber, kNativeView, kNativeIndices };

// The fields of the plan records (ops/dispatch/plans.py: NativePlan, NativeRule, HostRule), read
// by name through these; configure_plans checks they are the Python records' fields, in order.
enum PlanField : Py_ssize_t {
  kPlanProgram,
  kPlanDefaults,
  kPlanDefaultDtype,
  kPlanRules,
  kPlanReadsViews,
  kPlanHostRule,
  kPlanCheck,
  kPlanTraced,
};
enum RuleField : Py_ssize_t { kRulePosition, kRuleHow, kRuleDefault, kRuleConvert };
enum HostRuleField : Py_ssize_t { kHostShadow, kHostCopies };
const std::vector<std::pair<const char*, std::vector<const char*>>> kRecordFields = {
    {"NativePlan",
     {"program", "defaults", "default_dtype", "rules", "reads_views", "host_rule", "check", "traced"}},
    {"NativeRule", {"position", "how", "default", "convert"}},
    {"HostRule", {"shadow", "copies"}},
};

// Refuse Python plan records whose fields are not the ones the enums above name.
void check_record_fields(const py::dict& fields) {
  for (const auto& [record, names] : kRecordFields) {
    auto python = py::tuple(fields[record]);
    bool same = python.size() == names.size();
    for (size_t i = 0; same && i < names.size(); ++i) {
      same = python[i].cast<std::string>() == names[i];
    }
    if (!same) {
      throw std::runtime_error(
          std::string("torch_tpu: the C++ core reads ") + record +
          " with other fields than ops/dispatch/plans.py declares: rebuild it (pip install -e .)");
    }
  }
}
// What an op returns (dispatch.install._RETURNS_*): one contiguous tensor, one tensor laid out like its
// tensor inputs (an elementwise op's: tensor.wrap_elementwise), a tuple (dispatch.variants.wrap_output),
// or its first argument, into which an in-place variant writes its program's one output
// (tensor.write_whole: a tensor that is its whole storage, of the output's shape and dtype)
enum Returns : long { kOne, kLikeInputs, kTuple, kWritesFirst };

void configure_plans(
    py::dict platform,
    py::dict dispatch,
    py::dict config,
    py::handle context,
    py::handle wrap,
    py::handle wrap_elementwise,
    py::handle number,
    py::handle wrap_output,
    py::handle write_whole,
    py::dict record_fields) {
  check_record_fields(record_fields);
  g_plans.platform = platform.inc_ref().ptr();
  g_plans.dispatch = dispatch.inc_ref().ptr();
  g_plans.config = config.inc_ref().ptr();
  g_plans.context = context.inc_ref().ptr();
  g_plans.wrap = wrap.inc_ref().ptr();
  g_plans.wrap_elementwise = wrap_elementwise.inc_ref().ptr();
  g_plans.number = number.inc_ref().ptr();
  g_plans.wrap_output = wrap_output.inc_ref().ptr();
  g_plans.write_whole = write_whole.inc_ref().ptr();
  g_zero = PyLong_FromLong(0);
  g_plans.attention_needed = PyUnicode_InternFromString("attention_needed");
  g_plans.others_used = PyUnicode_InternFromString("others_used");
  g_plans.recorded_ops = PyUnicode_InternFromString("recorded_ops");
  g_plans.check_meta = PyUnicode_InternFromString("check_meta");
  g_plans.recorder = PyUnicode_InternFromString("recorder");
  g_plans.record = PyUnicode_InternFromString("record");
  g_plans.graph = PyUnicode_InternFromString("graph");
  g_plans.launch_blocking = PyUnicode_InternFromString("launch_blocking");
  g_plans.op = PyUnicode_InternFromString("op");
}

// Whether a module global is the object `expected` (a missing one is not).
bool global_is(PyObject* globals, PyObject* name, PyObject* expected) {
  return PyDict_GetItemWithError(globals, name) == expected;
}

// Whether a call of `op` may run from a plan: the per-process and per-thread state the Python
// kernel's fast path tests (ops/dispatch/kernel.py, Compute.call), as it is now; `recorder` is
// then the thread's fused recorder (None in strict mode).
bool plans_apply(PyObject* op, py::object& recorder) {
  recorder = py::reinterpret_steal<py::object>(PyObject_GetAttr(g_plans.context, g_plans.recorder));
  if (!recorder) {
    return false;
  }
  if (!global_is(g_plans.platform, g_plans.attention_needed, Py_False) ||
      !global_is(g_plans.platform, g_plans.others_used, Py_False) ||
      !global_is(g_plans.config, g_plans.check_meta, Py_False) ||
      at::globalContext().float32MatmulPrecision() != at::Float32MatmulPrecision::HIGHEST) {
    return false;
  }
  auto blocking = py::reinterpret_steal<py::object>(PyObject_GetAttr(g_plans.context, g_plans.launch_blocking));
  if (blocking.ptr() != Py_False) {
    return false;
  }
  PyObject* recorded = PyDict_GetItemWithError(g_plans.dispatch, g_plans.recorded_ops);
  return recorded == Py_None || (recorded != nullptr && PySet_CheckExact(recorded) && PySet_Add(recorded, op) == 0);
}

// One output of a planned program as the op's tensor: the core's (value_tensor) where it makes
// one, else Python's wrap of it (tensor.wrap; tensor.wrap_elementwise for an elementwise op,
// which the core leaves to Python where its inputs are not all contiguous; for an item of a
// tuple dispatch.variants.wrap_output: None, a list of outputs, a value to put on the device first).
struct WrappedOutput {
  at::Tensor tensor;  // the core's, where defined
  py::object python;  // else Python's (null where its wrap raised)
};

WrappedOutput wrap_program_output(long returns, PyObject* item, PyObject* args) {
  if (returns != kLikeInputs || tensors_contiguous(args)) {
    at::Tensor tensor = value_tensor(item);
    if (tensor.defined()) {
      return {std::move(tensor), {}};
    }
  }
  PyObject* wrapped = returns == kTuple ? PyObject_CallOneArg(g_plans.wrap_output, item)
      : returns == kLikeInputs          ? PyObject_CallFunctionObjArgs(g_plans.wrap_elementwise, item, args, nullptr)
                                        : PyObject_CallOneArg(g_plans.wrap, item);
  return {{}, py::reinterpret_steal<py::object>(wrapped)};
}

// The outputs of a planned program (one, or each of a tuple's) as wrap_program_output makes them, in
// order; false, with the error set, where a Python wrap raised or a tuple-returning op's program
// returned no tuple.
bool wrap_each_output(long returns, PyObject* out, PyObject* args, c10::SmallVector<WrappedOutput, 2>& outputs) {
  if (returns != kTuple) {
    outputs.push_back(wrap_program_output(returns, out, args));
    return outputs.back().tensor.defined() || outputs.back().python;
  }
  if (!PyTuple_Check(out)) {
    PyErr_SetString(PyExc_TypeError, "PlannedKernel: a program of a tuple-returning op returned no tuple");
    return false;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(out); ++i) {
    outputs.push_back(wrap_program_output(kTuple, PyTuple_GET_ITEM(out, i), args));
    if (!outputs.back().tensor.defined() && !outputs.back().python) {
      return false;
    }
  }
  return true;
}

// The op's outputs as its Python kernel returns them (ops/dispatch/variants.py, functional_kernel).
PyObject* wrap_outputs(long returns, const py::object& out, PyObject* args) {
  c10::SmallVector<WrappedOutput, 2> outputs;
  if (!wrap_each_output(returns, out.ptr(), args, outputs)) {
    return nullptr;
  }
  auto as_object = [](WrappedOutput& output) {
    return output.tensor.defined() ? THPVariable_Wrap(std::move(output.tensor)) : output.python.release().ptr();
  };
  if (returns != kTuple) {
    return as_object(outputs[0]);
  }
  py::tuple tensors(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    PyTuple_SET_ITEM(tensors.ptr(), i, as_object(outputs[i]));
  }
  return tensors.release().ptr();
}

// The StridedView a fused node reads `tensor` through, over its storage's `value`: its start
// (None at offset 0, else the offset as dispatch.conversion.number's device scalar), shape and addressing
// strides; nullptr, with the error set, where the start's conversion raised.
py::object view_over(const at::Tensor& tensor, const py::object& value) {
  py::object start = py::none();
  if (tensor.storage_offset() != 0) {
    auto offset = py::reinterpret_steal<py::object>(PyLong_FromLongLong(tensor.storage_offset()));
    PyObject* pair[] = {offset.ptr(), g_zero};
    start = py::reinterpret_steal<py::object>(PyObject_Vectorcall(g_plans.number, pair, 2, nullptr));
    if (!start) {
      return {};
    }
  }
  return strided_view(value, start, tensor.sizes(), addressing_strides(tensor));
}

// A tpu view as tensor.read_in_program hands it to an op recorded in a fused graph (every view
// there is read inside its op's node): view_over its storage's value. None where Python reads it
// (a complex view, which it reads resolved; a value storage_value leaves to Python).
py::object recorded_view(const at::Tensor& tensor) {
  if (c10::isComplexType(tensor.scalar_type())) {
    return py::none();
  }
  py::object shape;
  py::object value = storage_value(tensor, shape);
  return value.is_none() ? value : view_over(tensor, value);
}

// tensor.read_in_program while a fused graph records, in one call and one read of the storage:
// the value of a tensor that is its whole storage in order (as whole_value), else its view as
// recorded_view makes it; None where Python reads it (recorded_view's cases, and views' start
// offsets on a device other than tpu:0).
py::object read_recorded(py::handle object) {
  if (g_values.attr == nullptr || !THPVariable_Check(object.ptr())) {
    return py::none();
  }
  const at::Tensor& tensor = THPVariable_Unpack(object.ptr());
  py::object shape;
  py::object value = storage_value(tensor, shape);  // (read once: whole or not)
  if (value.is_none() ||
      (tensor.is_contiguous() && tensor.storage_offset() == 0 && same_sizes(shape, tensor.sizes()))) {
    return value;
  }
  if (c10::isComplexType(tensor.scalar_type()) || g_plans.platform == nullptr ||
      !global_is(g_plans.platform, g_plans.others_used, Py_False)) {
    PyErr_Clear();
    return py::none();
  }
  py::object view = view_over(tensor, value);
  if (!view) {
    throw py::error_already_set();
  }
  return view;
}

// Whether a static argument is, or lists, a float JAX's jit cache would merge with another: -0.0
// (equal to 0.0) or NaN (dispatch.conversion.ExactStatic).
bool merged_by_jit(PyObject* value) {
  if (PyFloat_CheckExact(value)) {
    const double x = PyFloat_AS_DOUBLE(value);
    return std::isnan(x) || (x == 0.0 && std::signbit(x));
  }
  if (PyList_Check(value)) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); ++i) {
      if (merged_by_jit(PyList_GET_ITEM(value, i))) {
        return true;
      }
    }
  }
  return false;
}

// Whether `item` (an argument, or an item of a list argument) is a tensor of `storage`.
bool shares(PyObject* item, const c10::StorageImpl* storage) {
  return THPVariable_Check(item) && THPVariable_Unpack(item).storage().unsafeGetStorageImpl() == storage;
}

// Whether an in-place call's first argument shares its storage with none of the others, nor with
// a tensor of a list among them (a tensor that does is left to Python, which refuses a partial
// overlap as PyTorch does).
bool first_stands_alone(PyObject* args) {
  PyObject* first = PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, 0) : nullptr;
  if (first == nullptr || !THPVariable_Check(first)) {
    return false;
  }
  const c10::StorageImpl* storage = THPVariable_Unpack(first).storage().unsafeGetStorageImpl();
  for (Py_ssize_t i = 1; i < PyTuple_GET_SIZE(args); ++i) {
    PyObject* item = PyTuple_GET_ITEM(args, i);
    if (shares(item, storage)) {
      return false;
    }
    for (Py_ssize_t k = 0; PyList_Check(item) && k < PyList_GET_SIZE(item); ++k) {
      if (shares(PyList_GET_ITEM(item, k), storage)) {
        return false;
      }
    }
  }
  return true;
}

// A list of indices (Tensor?[]) as dispatch.conversion.indices_to_jax makes it, where each is None or a
// tpu tensor that is its whole storage value; else None (Python converts it).
py::object whole_indices(PyObject* indices) {
  if (!PyList_Check(indices)) {
    return py::none();
  }
  const Py_ssize_t count = PyList_GET_SIZE(indices);
  py::list values(count);
  for (Py_ssize_t k = 0; k < count; ++k) {
    PyObject* item = PyList_GET_ITEM(indices, k);
    py::object value = item == Py_None ? py::none() : whole_value(item);
    if (value.is_none() && item != Py_None) {
      return py::none();
    }
    PyList_SET_ITEM(values.ptr(), k, value.release().ptr());
  }
  return std::move(values);
}

// Whether one of `values` (a planned call's operands) has a host copy, for a plan whose op has a
// host rule (`host_rule`: a HostRule, dispatch.programs.shadow for it taking the call's arguments and output,
// buffer.host_copies_by_id); None for an op without one).
bool operand_has_host_copy(PyObject* host_rule, PyObject* values) {
  if (host_rule == Py_None) {
    return false;
  }
  PyObject* copies = PyTuple_GET_ITEM(host_rule, kHostCopies);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(values); ++i) {
    auto id = py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(PyTuple_GET_ITEM(values, i)));
    if (!id || PyDict_Contains(copies, id.ptr()) != 0) {
      PyErr_Clear();
      return true;
    }
  }
  return false;
}

// The output of the plan's program run for the call; nullptr and no error where no plan applies.
PyObject* run_program(PlannedKernel* self, PyObject* args) {
  if (self->returns == kWritesFirst && !first_stands_alone(args)) {
    return nullptr;
  }
  py::object recorder;
  if (g_plans.context == nullptr || !plans_apply(self->op, recorder)) {
    PyErr_Clear();  // (a state not readable as expected: the Python kernel's own reading)
    return nullptr;
  }
  py::object operands = whole_operands(args, self->views_read_in_program);
  if (operands.is_none()) {
    return nullptr;
  }
  // (held: another thread may replace the entry while the program runs without the GIL)
  auto plan = py::reinterpret_borrow<py::object>(
      PyDict_GetItemWithError(self->plans, PyTuple_GET_ITEM(operands.ptr(), 0)));
  auto* default_dtype = reinterpret_cast<PyObject*>(
      torch::getTHPDtype(c10::typeMetaToScalarType(c10::get_default_dtype())));
  if (!plan || PyTuple_GET_ITEM(plan.ptr(), kPlanDefaultDtype) != default_dtype) {
    return nullptr;
  }
  if (recorder.ptr() == Py_None && PyTuple_GET_ITEM(plan.ptr(), kPlanReadsViews) == Py_True) {
    return nullptr;  // (it reads views, which strict eager reads apart: Python's)
  }
  PyObject* values = PyTuple_GET_ITEM(operands.ptr(), 1);
  PyObject* host_rule = PyTuple_GET_ITEM(plan.ptr(), kPlanHostRule);
  const bool on_host_too = operand_has_host_copy(host_rule, values);
  PyObject* defaults = PyTuple_GET_ITEM(plan.ptr(), kPlanDefaults);
  const Py_ssize_t given = PyTuple_GET_SIZE(values);
  const Py_ssize_t count = given + PyTuple_GET_SIZE(defaults);
  c10::SmallVector<PyObject*, 16> stack(count + 1);  // (slot 0 free: PY_VECTORCALL_ARGUMENTS_OFFSET)
  for (Py_ssize_t i = 0; i < count; ++i) {
    stack[i + 1] = i < given ? PyTuple_GET_ITEM(values, i) : PyTuple_GET_ITEM(defaults, i - given);
  }
  // the plan's conversions, as the Python kernel's fast path does them (dispatch.plans.native_rules)
  c10::SmallVector<py::object, 4> converted;
  PyObject* rules = PyTuple_GET_ITEM(plan.ptr(), kPlanRules);
  for (Py_ssize_t r = 0; r < PyTuple_GET_SIZE(rules); ++r) {
    PyObject* rule = PyTuple_GET_ITEM(rules, r);
    PyObject*& value = stack[PyLong_AsSsize_t(PyTuple_GET_ITEM(rule, kRulePosition)) + 1];
    PyObject* fallback = PyTuple_GET_ITEM(rule, kRuleDefault);
    const long how = PyLong_AsLong(PyTuple_GET_ITEM(rule, kRuleHow));
    if (how == kNativeView) {
      converted.push_back(THPVariable_Check(value) ? recorded_view(THPVariable_Unpack(value)) : py::none());
      if (!converted.back() || converted.back().is_none()) {
        return nullptr;  // (an error set, or Python reads it)
      }
      value = converted.back().ptr();
      continue;
    }
    if (how == kNativeIndices) {
      converted.push_back(whole_indices(value));
      if (converted.back().is_none()) {
        return nullptr;
      }
      value = converted.back().ptr();
      continue;
    }
    if (how == kNativeStatic) {
      if (merged_by_jit(value)) {
        return nullptr;  // (Python's dispatch.conversion.exact_static keys it)
      }
      if (PyList_Check(value)) {  // (a shape or dims list: the program's static tuple)
        converted.push_back(py::reinterpret_steal<py::object>(PyList_AsTuple(value)));
        if (!converted.back()) {
          return nullptr;
        }
        value = converted.back().ptr();
      }
      continue;
    }
    if (Py_TYPE(value) == Py_TYPE(fallback)) {
      const int same = PyObject_RichCompareBool(value, fallback, Py_EQ);
      if (same < 0) {
        return nullptr;
      }
      if (same) {
        value = Py_None;  // (its default: a constant of the program)
        continue;
      }
    }
    if (value != Py_None) {  // (the number's own conversion, dispatch's FittedNumber, or number)
      PyObject* own = PyTuple_GET_ITEM(rule, kRuleConvert);
      PyObject* number = own != Py_None ? own : g_plans.number;
      PyObject* pair[] = {value, g_zero};
      converted.push_back(py::reinterpret_steal<py::object>(PyObject_Vectorcall(number, pair, 2, nullptr)));
      if (!converted.back()) {  // (a fitted number refused: the Python kernel refuses it in CPU's order)
        if (PyErr_ExceptionMatches(PyExc_Exception)) {
          PyErr_Clear();
        }
        return nullptr;
      }
      value = converted.back().ptr();
    }
  }
  if (PyObject_SetAttr(g_plans.context, g_plans.op, self->name) != 0) {
    return nullptr;
  }
  PyObject* check = PyTuple_GET_ITEM(plan.ptr(), kPlanCheck);
  if (check != Py_None) {  // (one that refuses: the Python kernel runs the call again and raises)
    PyObject* passed = PyObject_Vectorcall(check, stack.data() + 1, count | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    if (passed == nullptr) {
      if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
      }
      return nullptr;
    }
    Py_DECREF(passed);
  }
  PyObject* program = PyTuple_GET_ITEM(plan.ptr(), kPlanProgram);
  PyObject* out;
  if (recorder.ptr() == Py_None || PyTuple_GET_ITEM(plan.ptr(), kPlanTraced) == Py_False) {
    out = PyObject_Vectorcall(program, stack.data() + 1, count | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  } else {  // a pending output, under the "highest" precision (None) tested above: the
            // node recorded here where it repeats the graph's template, else
            // recorder.record(program, arguments, None, name, None)
    auto arguments = py::reinterpret_steal<py::object>(PyTuple_New(count));
    auto graph = py::reinterpret_steal<py::object>(PyObject_GetAttr(recorder.ptr(), g_plans.graph));
    if (!arguments || !graph) {
      return nullptr;
    }
    for (Py_ssize_t i = 0; i < count; ++i) {
      Py_INCREF(stack[i + 1]);
      PyTuple_SET_ITEM(arguments.ptr(), i, stack[i + 1]);
    }
    out = torch_tpu::record_repeated(graph.ptr(), program, arguments.ptr(), Py_None);
    if (out == Py_NotImplemented) {
      Py_DECREF(out);
      PyObject* call[] = {recorder.ptr(), program, arguments.ptr(), Py_None, self->name, Py_None};
      out = PyObject_VectorcallMethod(g_plans.record, call, 6, nullptr);
    }
  }
  if (out == nullptr && PyErr_ExceptionMatches(PyExc_Exception)) {
    PyErr_Clear();  // the Python kernel runs the call again and raises PyTorch's error
  }
  if (out != nullptr && on_host_too) {  // (its result's host copy, computed by the rule)
    PyObject* kept = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(host_rule, kHostShadow), args, out, nullptr);
    if (kept == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(kept);
  }
  return out;
}

// An in-place call's output stored into its first argument (tensor.write_whole): whether it
// was; false, with no error, where Python stores it (the Python kernel runs the call again).
bool write_first(PyObject* args, PyObject* out) {
  PyObject* written = PyObject_CallFunctionObjArgs(g_plans.write_whole, PyTuple_GET_ITEM(args, 0), out, nullptr);
  if (written == nullptr) {
    PyErr_Clear();
    return false;
  }
  Py_DECREF(written);
  return written == Py_True;
}

// The call served from its plan: a new tensor (an in-place call's first argument); nullptr and no
// error where no plan applies.
PyObject* run_plan(PlannedKernel* self, PyObject* args) {
  auto out = py::reinterpret_steal<py::object>(run_program(self, args));
  if (out && self->returns == kWritesFirst) {
    return write_first(args, out.ptr()) ? Py_NewRef(PyTuple_GET_ITEM(args, 0)) : nullptr;
  }
  return out ? wrap_outputs(self->returns, out, args) : nullptr;
}

PyObject* planned_kernel_call(PyObject* object, PyObject* args, PyObject* kwargs) {
  auto* self = reinterpret_cast<PlannedKernel*>(object);
  if (self->kernel == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "PlannedKernel: cleared");
    return nullptr;
  }
  if (kwargs == nullptr || PyDict_GET_SIZE(kwargs) == 0) {
    PyObject* result = returning([&] { return py::reinterpret_steal<py::object>(run_plan(self, args)); });
    if (result != nullptr || PyErr_Occurred()) {
      return result;
    }
  }
  return PyObject_Call(self->kernel, args, kwargs);
}

PyObject* planned_kernel_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *kernel, *plans, *op, *name, *views;
  long returns;
  static const char* names[] = {"kernel", "plans", "op", "name", "views_read_in_program", "returns", nullptr};
  if (!PyArg_ParseTupleAndKeywords(
          args, kwargs, "OO!OUO!l:PlannedKernel", const_cast<char**>(names), &kernel, &PyDict_Type, &plans, &op,
          &name, &PyLong_Type, &views, &returns)) {
    return nullptr;
  }
  if (returns < kOne || returns > kWritesFirst) {
    PyErr_SetString(
        PyExc_ValueError,
        "PlannedKernel: returns is 0 (one tensor), 1 (laid out like inputs), 2 (a tuple) or 3 (its first argument)");
    return nullptr;
  }
  const uint64_t positions = PyLong_AsUnsignedLongLong(views);
  if (PyErr_Occurred()) {
    return nullptr;
  }
  auto* self = reinterpret_cast<PlannedKernel*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    return nullptr;
  }
  self->kernel = Py_NewRef(kernel);
  self->plans = Py_NewRef(plans);
  self->op = Py_NewRef(op);
  self->name = Py_NewRef(name);
  self->views_read_in_program = positions;
  self->returns = returns;
  return reinterpret_cast<PyObject*>(self);
}

int planned_kernel_traverse(PyObject* object, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<PlannedKernel*>(object);
  Py_VISIT(self->kernel);
  Py_VISIT(self->plans);
  Py_VISIT(self->op);
  Py_VISIT(self->name);
  Py_VISIT(Py_TYPE(object));  // (a heap type)
  return 0;
}

int planned_kernel_clear(PyObject* object) {
  auto* self = reinterpret_cast<PlannedKernel*>(object);
  Py_CLEAR(self->kernel);
  Py_CLEAR(self->plans);
  Py_CLEAR(self->op);
  Py_CLEAR(self->name);
  return 0;
}

void planned_kernel_dealloc(PyObject* object) {
  PyTypeObject* type = Py_TYPE(object);
  PyObject_GC_UnTrack(object);
  planned_kernel_clear(object);
  type->tp_free(object);
  Py_DECREF(type);
}

PyMemberDef g_planned_kernel_members[] = {
    {"kernel", T_OBJECT_EX, offsetof(PlannedKernel, kernel), READONLY, "the op's Python kernel"},
    {"plans", T_OBJECT_EX, offsetof(PlannedKernel, plans), READONLY, "{key: (program, defaults, default dtype, conversions)}"},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot g_planned_kernel_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(planned_kernel_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(planned_kernel_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(planned_kernel_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(planned_kernel_clear)},
    {Py_tp_call, reinterpret_cast<void*>(planned_kernel_call)},
    {Py_tp_members, g_planned_kernel_members},
    {Py_tp_doc,
     const_cast<char*>("PlannedKernel(kernel, plans, op, name, views_read_in_program, returns): an op's tpu "
                       "kernel serving planned calls in C++, the others by `kernel`")},
    {0, nullptr}};

PyType_Spec g_planned_kernel_spec = {
    "torch_tpu._C.PlannedKernel", sizeof(PlannedKernel), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    g_planned_kernel_slots};

PyMethodDef g_per_op_functions[] = {
    {"whole_value", call_with_one<whole_value>, METH_O, "whole_value(tensor): its whole storage's value, or None"},
    {"read_recorded",
     call_with_one<read_recorded>,
     METH_O,
     "read_recorded(tensor): its whole storage's value or its view as a fused node reads it, or None"},
    {"wrap_value",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call_wrap_value)),
     METH_FASTCALL,
     "wrap_value(value[, inputs]): a new contiguous tpu tensor holding it, or None"},
    {"whole_operands",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call_whole_operands)),
     METH_FASTCALL,
     "whole_operands(args, views_read_in_program): (key, values), or None"},
    {nullptr, nullptr, 0, nullptr}};

// ----------------------------------------------------------------------------- boxed planned kernels
// A PlannedKernel registered with the dispatcher directly, in place of the Python kernel holder
// torch.library would wrap around it: the call's arguments become Python objects as that holder
// makes them (torch::jit::toPyObject; trailing positional and keyword-only arguments equal to
// their defaults left out, other keyword-only ones passed by name), the PlannedKernel runs, and
// its tensors go back on the stack. Only ops whose arguments the holder converts with
// toPyObject too (no dtype, layout or memory-format argument) and that return tensors are served
// here (serve_boxed); the holder's own steps for tensor subclasses and dispatch modes call the
// same Python function, which this calls in every case.
bool converted_like_the_holder(const c10::TypePtr& type) {
  const c10::TypePtr& inner = type->kind() == c10::TypeKind::OptionalType
      ? type->castRaw<c10::OptionalType>()->getElementType()
      : type;
  switch (inner->kind()) {
    case c10::TypeKind::TensorType:
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
    case c10::TypeKind::FloatType:
    case c10::TypeKind::BoolType:
    case c10::TypeKind::NumberType:
    case c10::TypeKind::StringType:
      return true;
    case c10::TypeKind::ListType: {
      const auto kind = inner->castRaw<c10::ListType>()->getElementType()->kind();
      return kind == c10::TypeKind::IntType || kind == c10::TypeKind::SymIntType ||
          kind == c10::TypeKind::FloatType || kind == c10::TypeKind::BoolType;
    }
    default:
      return false;
  }
}

// An argument as the holder's torch::jit::toPyObject makes it. A number PyTorch wrapped into a CPU
// tensor (`x * 2`) becomes that number: read here where the tensor has no Python object, so no
// `_wrapped_number` attribute (toPyObject makes the object and looks the attribute up, a failed
// lookup raising and clearing an AttributeError at every call); the rest is toPyObject's.
py::object holder_object(const c10::IValue& argument) {
  if (argument.isTensor()) {
    const at::Tensor& tensor = argument.toTensor();
    c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
    if (impl->is_wrapped_number() && impl->pyobj_slot()->load_pyobj() == nullptr && tensor.device().is_cpu()) {
      switch (tensor.scalar_type()) {
        case at::ScalarType::Bool:
          return py::bool_(*tensor.const_data_ptr<bool>());
        case at::ScalarType::Long:
          return py::int_(*tensor.const_data_ptr<int64_t>());
        case at::ScalarType::Double:
          return py::float_(*tensor.const_data_ptr<double>());
        default:
          break;  // (uint64, complex: toPyObject's)
      }
    }
  }
  return torch::jit::toPyObject(argument);
}

struct BoxedPlannedKernel final : c10::OperatorKernel {
  BoxedPlannedKernel(PyObject* planned, size_t keywords_start) : planned(planned), keywords_start(keywords_start) {}
  PyObject* planned;  // the PlannedKernel (kept for the process's lifetime, as the library is)
  size_t keywords_start;  // the schema's first keyword-only argument (their count if none)

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const auto& declared = schema.arguments();
    const size_t count = declared.size();
    auto arguments = torch::jit::last(*stack, count);
    auto is_default = [&](size_t i) {
      const auto& fallback = declared[i].default_value();
      return fallback.has_value() && *fallback == arguments[i];
    };
    // the call as the plans know it (dispatch.binding.Binder.positional): its arguments up to the last
    // one not at its default, a keyword-only one too (`x.add(y, alpha=2)`)
    size_t used = count;
    while (used > 0 && is_default(used - 1)) {
      --used;
    }
    py::gil_scoped_acquire gil;
    py::tuple call(used);
    for (size_t i = 0; i < used; ++i) {
      PyTuple_SET_ITEM(call.ptr(), i, holder_object(arguments[i]).release().ptr());
    }
    auto* self = reinterpret_cast<PlannedKernel*>(planned);
    TORCH_CHECK(self->kernel != nullptr, schema.name(), ": its PlannedKernel was cleared");
    {
      auto out = py::reinterpret_steal<py::object>(run_program(self, call.ptr()));
      if (out && self->returns == kWritesFirst) {
        if (write_first(call.ptr(), out.ptr())) {
          at::Tensor first = arguments[0].toTensor();
          torch::jit::drop(*stack, count);
          torch::jit::push(*stack, std::move(first));
          return;
        }
      } else if (out) {  // (the core's tensors go on the stack as they are: no Python object made for them)
        c10::SmallVector<WrappedOutput, 2> outputs;
        if (!wrap_each_output(self->returns, out.ptr(), call.ptr(), outputs)) {
          raise_if_set();
        }
        TORCH_CHECK(
            outputs.size() == schema.returns().size(), schema.name(), ": its program returned ", outputs.size(),
            " outputs, not ", schema.returns().size());
        torch::jit::drop(*stack, count);
        for (auto& output : outputs) {
          torch::jit::push(*stack, output.tensor.defined() ? std::move(output.tensor) : unpacked(output.python.ptr(), schema));
        }
        return;
      }
      raise_if_set();
    }
    // the Python kernel's call: the positional arguments given, the keyword-only ones by name
    py::object args = call, kwargs;
    if (used > keywords_start) {
      size_t positional = keywords_start;
      while (positional > 0 && is_default(positional - 1)) {
        --positional;
      }
      args = py::reinterpret_steal<py::object>(PyTuple_GetSlice(call.ptr(), 0, positional));
      kwargs = py::dict();
      for (size_t i = keywords_start; i < used; ++i) {
        if (!is_default(i)) {
          kwargs[declared[i].name().c_str()] = call[i];
        }
      }
    }
    auto result = py::reinterpret_steal<py::object>(PyObject_Call(self->kernel, args.ptr(), kwargs.ptr()));
    raise_if_set();
    const size_t returns = schema.returns().size();
    torch::jit::drop(*stack, count);
    if (returns == 1) {
      torch::jit::push(*stack, unpacked(result.ptr(), schema));
      return;
    }
    TORCH_CHECK(
        PyTuple_Check(result.ptr()) && static_cast<size_t>(PyTuple_GET_SIZE(result.ptr())) == returns,
        schema.name(), ": its tpu kernel returned no tuple of ", returns, " tensors");
    for (size_t i = 0; i < returns; ++i) {
      torch::jit::push(*stack, unpacked(PyTuple_GET_ITEM(result.ptr(), i), schema));
    }
  }

  // A Python error raised by the call as the C++ exception PyTorch's bindings raise again.
  static void raise_if_set() {
    if (PyErr_Occurred()) {
      python_error error;
      error.persist();
      throw std::move(error);
    }
  }

  static at::Tensor unpacked(PyObject* item, const c10::FunctionSchema& schema) {
    if (item == Py_None) {
      return at::Tensor();  // (an output not computed: as the holder's conversion)
    }
    TORCH_CHECK(
        THPVariable_Check(item), schema.name(), ": its tpu kernel returned a ", Py_TYPE(item)->tp_name,
        ", not a tensor");
    return THPVariable_Unpack(item);
  }

};

// Registers `planned` (a PlannedKernel) as the tpu kernel of aten::`name`.`overload` ("" for
// the default one) where BoxedPlannedKernel serves the op's schema; false, and nothing
// registered, where not.
bool serve_boxed(const std::string& name, const std::string& overload, py::handle planned) {
  static auto* library = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(("aten::" + name).c_str(), overload.c_str());
  const auto& schema = handle.schema();
  if (schema.is_vararg() || schema.is_varret() || schema.returns().empty()) {
    return false;
  }
  for (const auto& argument : schema.arguments()) {
    if (!converted_like_the_holder(argument.real_type())) {
      return false;
    }
  }
  for (const auto& output : schema.returns()) {
    if (output.type()->kind() != c10::TypeKind::TensorType) {
      return false;
    }
  }
  size_t keywords_start = schema.arguments().size();
  while (keywords_start > 0 && schema.arguments()[keywords_start - 1].kwarg_only()) {
    --keywords_start;
  }
  library->impl(
      (overload.empty() ? name : name + "." + overload).c_str(),
      torch::CppFunction::makeFromBoxedFunctor(
          std::make_unique<BoxedPlannedKernel>(planned.inc_ref().ptr(), keywords_start)));
  return true;
}

// Take `count` consecutive counter values from a tpu generator: (seed, first offset).
std::pair<uint64_t, uint64_t> draw(at::Generator generator, uint64_t count) {
  auto* impl = at::check_generator<TpuGenerator>(generator);
  std::lock_guard<std::mutex> lock(generator.mutex());
  const uint64_t offset = impl->get_offset();
  impl->set_offset(offset + count);
  return {impl->current_seed(), offset};
}

void install(py::object callbacks, int device_count) {
  TORCH_CHECK(!at::isPrivateUse1HooksRegistered(), "PrivateUse1 hooks are already registered");
  g_callbacks = callbacks.release().ptr();
  g_device_count = device_count;
  static TpuHooks hooks;
  static TpuGuard guard;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  c10::impl::registerDeviceGuard(kTpu, &guard);
  c10::SetAllocator(kTpu, &g_allocator);
}

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

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_tpu's C++ runtime core (hooks, device guard, device allocator, view kernels)";
  m.def("install", &install, py::arg("callbacks"), py::arg("device_count"));
  m.def("set_device_count", [](int count) { g_device_count = count; });
  m.def("empty", &empty);
  m.def("draw", &draw);
  m.def("configure_values", &configure_values);
  if (PyModule_AddFunctions(m.ptr(), g_per_op_functions) != 0) {
    throw py::error_already_set();
  }
  m.def("configure_plans", &configure_plans);
  m.def("serve_boxed", &serve_boxed);
  if (torch_tpu::add_fused_record(m.ptr()) != 0) {
    throw py::error_already_set();
  }
  PyObject* planned_kernel = PyType_FromSpec(&g_planned_kernel_spec);
  if (planned_kernel == nullptr || PyModule_AddObject(m.ptr(), "PlannedKernel", planned_kernel) != 0) {
    throw py::error_already_set();
  }
  m.def("default_generator", [](c10::DeviceIndex index) {
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(default_generator(index)));
  });
}
