// A simulated `neuron` device for the tests: PyTorch's PrivateUse1 backend on host memory.
//
// What TorchNeuron registers on a trn2 (a PrivateUse1 device, renamed `neuron` from Python), without Trainium:
// an allocator (host memory, with the counters torch.neuron.memory_stats reports), a device guard (device index,
// one stream per device, events that are always complete), the hooks PyTorch asks an out-of-tree device for
// (generators, storage resize, availability), the kernels a backend must own (empty, copies, views, resize, set_),
// and ATen's CPU fallback for every other operator. Random operators on the device draw from a per-device
// generator whose state is a seed and an offset, 16 bytes as CUDA's Philox state (DTensor reads it that way).
// Every operator dispatched to the device is counted by name and input dtypes for the census.

#include <torch/extension.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace neuron_sim {

using c10::DeviceIndex;
using c10::DeviceType;

constexpr int kMaxDevices = 64;
std::atomic<int> g_device_count{8};
thread_local DeviceIndex t_current_device = 0;

DeviceIndex device_count() {
  return static_cast<DeviceIndex>(g_device_count.load());
}

void check_index(DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < device_count(), "neuron: device index ", static_cast<int>(index),
              " out of range (", static_cast<int>(device_count()), " simulated devices)");
}

DeviceIndex resolve(DeviceIndex index) {
  return index < 0 ? t_current_device : index;
}

// ---- memory: host allocations with CUDA-style counters ------------------------------------------------------

struct MemoryCounters {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocations{0};
  std::atomic<int64_t> frees{0};
  std::atomic<int64_t> live_blocks{0};
};
std::array<MemoryCounters, kMaxDevices> g_memory;

struct Block {
  void* ptr;
  size_t nbytes;
  DeviceIndex device;
};

void free_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  auto& counters = g_memory[block->device];
  counters.current -= static_cast<int64_t>(block->nbytes);
  counters.frees += 1;
  counters.live_blocks -= 1;
  c10::free_cpu(block->ptr);
  delete block;
}

struct HostAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const DeviceIndex device = t_current_device;
    const c10::Device where(DeviceType::PrivateUse1, device);
    void* ptr = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (ptr == nullptr) {
      return c10::DataPtr(nullptr, nullptr, nullptr, where);
    }
    auto& counters = g_memory[device];
    const int64_t now = counters.current += static_cast<int64_t>(nbytes);
    int64_t peak = counters.peak.load();
    while (now > peak && !counters.peak.compare_exchange_weak(peak, now)) {
    }
    counters.allocations += 1;
    counters.live_blocks += 1;
    return c10::DataPtr(ptr, new Block{ptr, nbytes, device}, &free_block, where);
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};
HostAllocator g_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator)

// ---- the device guard: index per thread, one stream per device, events always complete ----------------------

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  static constexpr DeviceType static_type = DeviceType::PrivateUse1;

  DeviceType type() const override {
    return DeviceType::PrivateUse1;
  }
  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device old = getDevice();
    if (device.index() != old.index()) {
      setDevice(device);
    }
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(DeviceType::PrivateUse1, t_current_device);
  }
  void setDevice(c10::Device device) const override {
    check_index(device.index());
    t_current_device = device.index();
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    t_current_device = device.index();
  }
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getNewStream(c10::Device device, int) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }
  DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }
  void record(void** event, const c10::Stream&, const DeviceIndex, const c10::EventFlag) const override {
    if (event != nullptr && *event == nullptr) {
      *event = reinterpret_cast<void*>(1);  // a token: nothing is ever pending
    }
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override {
    return true;
  }
  void destroyEvent(void*, const DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void*, void*, const DeviceIndex) const override {
    return 0.0;
  }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl)

// ---- random numbers: a seed and an offset per device ----------------------------------------------------------

constexpr uint64_t kDefaultSeed = 67280421310721ULL;  // CUDA's default_rng_seed_val

struct Generator final : c10::GeneratorImpl {
  explicit Generator(DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(DeviceType::PrivateUse1, index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(uint64_t offset) override {
    offset_ = offset;
  }
  uint64_t get_offset() const override {
    return offset_;
  }
  uint64_t current_seed() const override {
    return seed_;
  }
  uint64_t seed() override {
    const uint64_t fresh = c10::detail::getNonDeterministicRandom();
    set_current_seed(fresh);
    return fresh;
  }
  // 16 bytes, seed then offset, each a little-endian uint64: the layout of CUDA's Philox state.
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.numel() == 16 && state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                "neuron: RNG state must be 16 bytes (uint8): seed and offset");
    const auto* bytes = static_cast<const uint8_t*>(state.data());
    std::memcpy(&seed_, bytes, 8);
    std::memcpy(&offset_, bytes + 8, 8);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto state = at::empty({16}, at::TensorOptions().dtype(at::kByte).device(at::kCPU));
    auto* bytes = state.data_ptr<uint8_t>();
    std::memcpy(bytes, &seed_, 8);
    std::memcpy(bytes + 8, &offset_, 8);
    return state.getIntrusivePtr();
  }
  static DeviceType device_type() {
    return DeviceType::PrivateUse1;
  }

 private:
  Generator* clone_impl() const override {
    auto* copy = new Generator(device().index());
    copy->seed_ = seed_;
    copy->offset_ = offset_;
    return copy;
  }
  uint64_t seed_ = kDefaultSeed;
  uint64_t offset_ = 0;
};

const at::Generator& default_generator(DeviceIndex index) {
  static std::array<at::Generator, kMaxDevices> generators;
  static std::once_flag once;
  std::call_once(once, [] {
    for (int i = 0; i < kMaxDevices; ++i) {
      generators[i] = at::make_generator<Generator>(static_cast<DeviceIndex>(i));
    }
  });
  index = resolve(index);
  check_index(index);
  return generators[index];
}

// ---- the hooks PyTorch asks an out-of-tree device for ---------------------------------------------------------

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return device_count() > 0;
  }
  bool hasPrimaryContext(DeviceIndex) const override {
    return true;
  }
  const at::Generator& getDefaultGenerator(DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(DeviceIndex index) const override {
    return at::make_generator<Generator>(resolve(index));
  }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(DeviceType::PrivateUse1, t_current_device);
  }
  bool isPinnedPtr(const void*) const override {
    return false;
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return c10::GetCPUAllocator();
  }
  DeviceIndex deviceCount() const override {
    return device_count();
  }
  void setCurrentDevice(DeviceIndex device) const override {
    check_index(device);
    t_current_device = device;
  }
  DeviceIndex getCurrentDevice() const override {
    return t_current_device;
  }
  DeviceIndex exchangeDevice(DeviceIndex device) const override {
    const DeviceIndex old = t_current_device;
    setCurrentDevice(device);
    return old;
  }
  DeviceIndex maybeExchangeDevice(DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  // UntypedStorage.resize_ (FSDP2 frees and re-allocates its unsharded parameters this way).
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "neuron: trying to resize storage that is not resizable");
    const size_t old_size = impl->nbytes();
    c10::DataPtr fresh;
    if (newsize > 0) {
      const c10::DeviceGuard guard(impl->device());
      fresh = impl->allocator()->allocate(newsize);
    }
    c10::DataPtr old = impl->set_data_ptr(std::move(fresh));
    impl->set_nbytes(newsize);
    const size_t keep = std::min(old_size, newsize);
    if (old.get() != nullptr && keep > 0) {
      std::memcpy(impl->mutable_data(), old.get(), keep);
    }
  }
};

// ---- the census: every operator that reaches the device ------------------------------------------------------

std::mutex g_census_mutex;
std::map<std::string, int64_t> g_census;
std::atomic<bool> g_census_on{true};

void count(const c10::OperatorHandle& op, const torch::jit::Stack* stack, size_t num_arguments) {
  if (!g_census_on.load(std::memory_order_relaxed)) {
    return;
  }
  const auto& name = op.schema().operator_name();
  std::string key = name.name;
  if (!name.overload_name.empty()) {
    key += "." + name.overload_name;
  }
  std::string dtypes;
  const auto arguments = torch::jit::last(*stack, num_arguments);
  for (const auto& value : arguments) {
    if (value.isTensor() && value.toTensor().defined()) {
      if (!dtypes.empty()) {
        dtypes += ",";
      }
      dtypes += c10::toString(value.toTensor().scalar_type());
    }
  }
  key += "(" + dtypes + ")";
  const std::lock_guard<std::mutex> lock(g_census_mutex);
  g_census[key] += 1;
}

// The kernels registered here are counted through a boxed wrapper around each of them, as the fallback is.
void count_named(const char* name, std::initializer_list<const at::Tensor*> tensors) {
  if (!g_census_on.load(std::memory_order_relaxed)) {
    return;
  }
  std::string key = std::string("aten::") + name;
  std::string dtypes;
  for (const auto* tensor : tensors) {
    if (tensor != nullptr && tensor->defined()) {
      if (!dtypes.empty()) {
        dtypes += ",";
      }
      dtypes += c10::toString(tensor->scalar_type());
    }
  }
  key += "(" + dtypes + ")";
  const std::lock_guard<std::mutex> lock(g_census_mutex);
  g_census[key] += 1;
}

// ---- the kernels a backend must own --------------------------------------------------------------------------

constexpr c10::DispatchKeySet kDeviceKeys(c10::DispatchKey::PrivateUse1);

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  const auto where = c10::device_or_default(device);
  TORCH_CHECK(where.is_privateuseone(), "neuron: empty on ", where);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "neuron: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "neuron: pinned memory is a host property");
  const c10::DeviceGuard guard(where);
  at::Tensor result = at::detail::empty_generic(size, &g_allocator, kDeviceKeys, c10::dtype_or_default(dtype),
                                          memory_format);
  count_named("empty.memory_format", {&result});
  return result;
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory) {
  const auto where = c10::device_or_default(device);
  TORCH_CHECK(where.is_privateuseone(), "neuron: empty_strided on ", where);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "neuron: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "neuron: pinned memory is a host property");
  const c10::DeviceGuard guard(where);
  at::Tensor result =
      at::detail::empty_strided_generic(size, stride, &g_allocator, kDeviceKeys, c10::dtype_or_default(dtype));
  count_named("empty_strided", {&result});
  return result;
}

// The same bytes seen as a host tensor (the device's memory is host memory).
at::Tensor as_host(const at::Tensor& tensor) {
  return at::from_blob(tensor.data_ptr(), tensor.sizes(), tensor.strides(), tensor.options().device(at::kCPU));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  count_named("_copy_from", {&self, &dst});
  TORCH_CHECK(self.defined() && dst.defined(), "neuron: _copy_from of an undefined tensor");
  if (self.numel() == 0) {
    return dst;
  }
  const at::Tensor source = self.is_cpu() ? self : as_host(self);
  at::Tensor target = dst.is_cpu() ? dst : as_host(dst);
  at::native::copy_(target, source, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  count_named("_copy_from_and_resize", {&self, &dst});
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  count_named("resize_", {&self});
  const c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  count_named("view", {&self});
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  count_named("as_strided", {&self});
  std::optional<int64_t> offset;
  if (storage_offset.has_value()) {
    offset = storage_offset->expect_int();
  }
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                                           offset);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  count_named("_reshape_alias", {&self});
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor unfold(const at::Tensor& self, int64_t dimension, int64_t size, int64_t step) {
  count_named("unfold", {&self});
  return at::native::unfold(self, dimension, size, step);
}

at::Tensor view_as_real(const at::Tensor& self) {
  count_named("view_as_real", {&self});
  return at::native::view_as_real(self);
}

at::Tensor view_as_complex(const at::Tensor& self) {
  count_named("view_as_complex", {&self});
  return at::native::view_as_complex(self);
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source) {
  count_named("set_.source_Storage", {&self});
  return at::native::set_(self, std::move(source));
}

at::Tensor& set_storage_offset(at::Tensor& self, at::Storage source, c10::SymInt storage_offset,
                               c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  count_named("set_.source_Storage_storage_offset", {&self});
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset.expect_int(),
                                      C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  count_named("set_.source_Tensor", {&self, &source});
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_empty(at::Tensor& self) {
  count_named("set_", {&self});
  const c10::DeviceGuard guard(self.device());
  at::Storage storage(at::Storage::use_byte_size_t(), 0, &g_allocator, /*resizable=*/true);
  return at::native::set_storage_cpu_(self, std::move(storage), 0, {0}, {});
}

void record_stream(at::Tensor& self, c10::Stream) {
  count_named("record_stream", {&self});  // one stream per device: nothing to record
}

bool is_generator_argument(const c10::Argument& argument) {
  auto type = argument.type();
  if (auto optional = type->cast<c10::OptionalType>()) {
    type = optional->getElementType();
  }
  return type->kind() == c10::TypeKind::GeneratorType;
}

// A random operator's generator: the device's (or the one passed, if it is a neuron generator) becomes a host
// generator seeded from its seed and offset, and the offset moves on by the numbers drawn, rounded up to 4 as
// Philox does. The same seed and offset give the same numbers; DTensor's tracker steers the offset.
void substitute_generator(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t num_arguments) {
  const auto& schema = op.schema().arguments();
  const size_t begin = stack->size() - num_arguments;
  int64_t drawn = 1;
  DeviceIndex device = -1;
  for (size_t i = 0; i < num_arguments; ++i) {
    const auto& value = (*stack)[begin + i];
    if (value.isTensor() && value.toTensor().defined()) {
      drawn = std::max<int64_t>(drawn, value.toTensor().numel());
      if (device < 0 && value.toTensor().is_privateuseone()) {
        device = value.toTensor().device().index();
      }
    } else if (value.isDevice() && value.toDevice().is_privateuseone()) {
      device = value.toDevice().index();
    } else if (value.isIntList() && schema[i].name() == "size") {
      int64_t product = 1;
      for (const auto n : value.toIntVector()) {
        product *= n;
      }
      drawn = std::max<int64_t>(drawn, product);
    }
  }
  for (size_t i = 0; i < num_arguments; ++i) {
    if (!is_generator_argument(schema[i])) {
      continue;
    }
    auto& value = (*stack)[begin + i];
    at::Generator source;
    if (value.isGenerator()) {
      source = value.toGenerator();
      if (source.device().type() != DeviceType::PrivateUse1) {
        continue;
      }
    } else {
      source = default_generator(device);
    }
    uint64_t seed = 0;
    uint64_t offset = 0;
    {
      const std::lock_guard<std::mutex> lock(source.mutex());
      seed = source.current_seed();
      offset = source.get_offset();
      source.set_offset(offset + static_cast<uint64_t>((drawn + 3) / 4 * 4));
    }
    uint64_t mixed = seed ^ (offset + 0x9E3779B97F4A7C15ULL + (seed << 6) + (seed >> 2));
    value = c10::IValue(at::detail::createCPUGenerator(mixed));
  }
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t num_arguments = op.schema().arguments().size();
  count(op, stack, num_arguments);
  substitute_generator(op, stack, num_arguments);
  // error_on_views: a view operator without a kernel here would silently become a copy on the host.
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("resize_", resize_);
  m.impl("view", view);
  m.impl("as_strided", as_strided);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("unfold", unfold);
  m.impl("view_as_real", view_as_real);
  m.impl("view_as_complex", view_as_complex);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_", set_empty);
  m.impl("record_stream", record_stream);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

// torch.autocast("neuron"): matrix products in the autocast dtype, everything else as it comes (activation
// checkpointing's recompute enters autocast for the accelerator; without a fallthrough every operator fails).
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  KERNEL_PRIVATEUSEONE(mm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(addmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(bmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(baddbmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(matmul, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(linear, lower_precision_fp)
}

// ---- what Python reads --------------------------------------------------------------------------------------

void register_hooks() {
  static std::once_flag once;
  std::call_once(once, [] { at::RegisterPrivateUse1HooksInterface(new Hooks()); });
}

std::map<std::string, int64_t> memory_stats(DeviceIndex index) {
  index = resolve(index);
  check_index(index);
  const auto& c = g_memory[index];
  const int64_t current = c.current.load();
  const int64_t peak = c.peak.load();
  std::map<std::string, int64_t> stats;
  for (const char* kind : {"allocated_bytes", "active_bytes", "reserved_bytes", "requested_bytes"}) {
    stats[std::string(kind) + ".all.current"] = current;
    stats[std::string(kind) + ".all.peak"] = peak;
  }
  stats["allocation.all.current"] = c.live_blocks.load();
  stats["allocation.all.allocated"] = c.allocations.load();
  stats["allocation.all.freed"] = c.frees.load();
  stats["num_alloc_retries"] = 0;
  stats["num_ooms"] = 0;
  return stats;
}

void reset_peak(DeviceIndex index) {
  index = resolve(index);
  check_index(index);
  g_memory[index].peak.store(g_memory[index].current.load());
}

std::map<std::string, int64_t> census() {
  const std::lock_guard<std::mutex> lock(g_census_mutex);
  return g_census;
}

void reset_census() {
  const std::lock_guard<std::mutex> lock(g_census_mutex);
  g_census.clear();
}

}  // namespace neuron_sim

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("register_hooks", &neuron_sim::register_hooks);
  m.def("set_device_count", [](int n) {
    TORCH_CHECK(n >= 1 && n <= neuron_sim::kMaxDevices, "neuron: 1 to ", neuron_sim::kMaxDevices, " devices");
    neuron_sim::g_device_count = n;
  });
  m.def("device_count", [] { return static_cast<int>(neuron_sim::device_count()); });
  m.def("current_device", [] { return static_cast<int>(neuron_sim::t_current_device); });
  m.def("set_device", [](int index) {
    neuron_sim::check_index(static_cast<c10::DeviceIndex>(index));
    neuron_sim::t_current_device = static_cast<c10::DeviceIndex>(index);
  });
  m.def("default_generator", [](int index) { return neuron_sim::default_generator(static_cast<c10::DeviceIndex>(index)); });
  m.def("memory_stats", [](int index) { return neuron_sim::memory_stats(static_cast<c10::DeviceIndex>(index)); });
  m.def("reset_peak", [](int index) { neuron_sim::reset_peak(static_cast<c10::DeviceIndex>(index)); });
  m.def("census", &neuron_sim::census);
  m.def("reset_census", &neuron_sim::reset_census);
  m.def("set_census", [](bool on) { neuron_sim::g_census_on = on; });
}
