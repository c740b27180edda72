// memsight's libtorch shim, part A (no CUDA headers needed): the CPU tensor allocator hook, the
// accelerator's caching-allocator statistics through ATen/DeviceAccelerator.h, autocast control,
// autograd backward with explicit grad outputs. Every extern "C" function catches C++ exceptions
// and returns a status (0 ok, 1 not available, -1 error with ms_last_error set).

#include <ATen/DeviceAccelerator.h>
#include <ATen/autocast_mode.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/csrc/autograd/autograd.h>

#include <malloc.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

thread_local std::string last_error;

int fail(const char* what) {
  last_error = what;
  return -1;
}

using SizeCallback = void (*)(uint64_t);
SizeCallback on_alloc = nullptr;
SizeCallback on_free = nullptr;

// Wraps libtorch's default CPU path (alloc_cpu/free_cpu), reports usable sizes to memsight and
// keeps libtorch's own profiler reporting (profiledCPUMemoryReporter) working.
struct TrackingCpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = c10::alloc_cpu(n);
    if (p != nullptr) {
      on_alloc(static_cast<uint64_t>(malloc_usable_size(p)));
      c10::profiledCPUMemoryReporter().New(p, n);
    }
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }
  static void release(void* p) {
    if (p == nullptr) return;
    on_free(static_cast<uint64_t>(malloc_usable_size(p)));
    c10::profiledCPUMemoryReporter().Delete(p);
    c10::free_cpu(p);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

TrackingCpuAllocator tracking_allocator;

}  // namespace

extern "C" {

// Copies the calling thread's last error message into buf (NUL-terminated); returns its length.
size_t ms_last_error(char* buf, size_t len) {
  if (len == 0) return last_error.size();
  size_t n = last_error.size() < len - 1 ? last_error.size() : len - 1;
  std::memcpy(buf, last_error.data(), n);
  buf[n] = 0;
  return last_error.size();
}

// Installs the tracking CPU allocator (priority 10 wins over the default). Call once, early.
int ms_install_cpu_allocator(SizeCallback alloc_cb, SizeCallback free_cb) {
  try {
    if (alloc_cb == nullptr || free_cb == nullptr) return fail("null callback");
    on_alloc = alloc_cb;
    on_free = free_cb;
    c10::SetCPUAllocator(&tracking_allocator, 10);
    return c10::GetCPUAllocator() == &tracking_allocator ? 0 : fail("SetCPUAllocator did not take");
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("unknown C++ exception");
  }
}

struct ms_stat {
  int64_t current, peak, allocated, freed;
};

struct ms_device_stats {
  ms_stat allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes;
  int64_t num_alloc_retries, num_ooms, num_device_alloc, num_device_free;
  uint64_t free_bytes, total_bytes;
};

// 1 with the device type (c10::DeviceType) when an accelerator is visible, 0 when none.
int ms_accelerator(int* device_type, int* device_count) {
  try {
    auto acc = at::accelerator::getAccelerator(false);
    if (!acc.has_value()) return 0;
    *device_type = static_cast<int>(acc.value());
    *device_count = static_cast<int>(at::accelerator::deviceCount());
    return 1;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("unknown C++ exception");
  }
}

// Initialises the accelerator's runtime for the device (stats throw before it is initialised).
int ms_accel_init(int8_t device) {
  try {
    auto acc = at::accelerator::getAccelerator(false);
    if (!acc.has_value()) return 1;
    at::globalContext().lazyInitDevice(acc.value());
    (void)device;
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("unknown C++ exception");
  }
}

int ms_accel_stats(int8_t device, ms_device_stats* out) {
  try {
    if (!at::accelerator::getAccelerator(false).has_value()) return 1;
    auto s = at::accelerator::getDeviceStats(device);
    auto agg = [](const c10::CachingAllocator::StatArray& a) {
      const auto& x = a[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
      return ms_stat{x.current, x.peak, x.allocated, x.freed};
    };
    out->allocated_bytes = agg(s.allocated_bytes);
    out->reserved_bytes = agg(s.reserved_bytes);
    out->active_bytes = agg(s.active_bytes);
    out->inactive_split_bytes = agg(s.inactive_split_bytes);
    out->requested_bytes = agg(s.requested_bytes);
    out->num_alloc_retries = s.num_alloc_retries;
    out->num_ooms = s.num_ooms;
    out->num_device_alloc = s.num_device_alloc;
    out->num_device_free = s.num_device_free;
    auto mem = at::accelerator::getMemoryInfo(device);
    out->free_bytes = mem.first;
    out->total_bytes = mem.second;
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("unknown C++ exception");
  }
}

int ms_accel_reset_peak(int8_t device) {
  try {
    if (!at::accelerator::getAccelerator(false).has_value()) return 1;
    at::accelerator::resetPeakStats(device);
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("unknown C++ exception");
  }
}

int ms_accel_empty_cache() {
  try {
    if (!at::accelerator::getAccelerator(false).has_value()) return 1;
    at::accelerator::emptyCache();
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("unknown C++ exception");
  }
}

// Autocast state of one device type, saved so it can be restored.
struct ms_autocast_state {
  int enabled;
  int dtype;
};

// Enters autocast on device_type with dtype (c10::ScalarType); writes the previous state.
int ms_autocast_enter(int device_type, int dtype, ms_autocast_state* prev) {
  try {
    auto dt = static_cast<c10::DeviceType>(device_type);
    prev->enabled = at::autocast::is_autocast_enabled(dt) ? 1 : 0;
    prev->dtype = static_cast<int>(at::autocast::get_autocast_dtype(dt));
    at::autocast::set_autocast_enabled(dt, true);
    at::autocast::set_autocast_dtype(dt, static_cast<at::ScalarType>(dtype));
    at::autocast::increment_nesting();
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("unknown C++ exception");
  }
}

// Leaves autocast: restores the previous state; the cast cache is cleared at the outermost exit.
int ms_autocast_exit(int device_type, const ms_autocast_state* prev) {
  try {
    auto dt = static_cast<c10::DeviceType>(device_type);
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(dt, prev->enabled != 0);
    at::autocast::set_autocast_dtype(dt, static_cast<at::ScalarType>(prev->dtype));
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("unknown C++ exception");
  }
}

// 1 when autocast is on for device_type, with its dtype.
int ms_autocast_query(int device_type, int* dtype) {
  try {
    auto dt = static_cast<c10::DeviceType>(device_type);
    *dtype = static_cast<int>(at::autocast::get_autocast_dtype(dt));
    return at::autocast::is_autocast_enabled(dt) ? 1 : 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("unknown C++ exception");
  }
}

// torch::autograd::backward(outputs, grad_outputs): accumulates into the leaves' .grad.
// Tensors are tch's C_tensor pointers (at::Tensor*).
int ms_backward(at::Tensor** outputs, at::Tensor** grads, size_t n, int keep_graph) {
  try {
    std::vector<at::Tensor> outs, gs;
    outs.reserve(n);
    gs.reserve(n);
    for (size_t i = 0; i < n; i++) {
      outs.push_back(*outputs[i]);
      gs.push_back(*grads[i]);
    }
    torch::autograd::backward(outs, gs, keep_graph != 0, false);
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("unknown C++ exception");
  }
}

}  // extern "C"
