// memsight's libtorch shim, part B (needs the CUDA runtime and crt headers, links c10_cuda): the
// CUDA caching allocator's OOM observer, trace tracker and snapshot summary. Compiled only where
// those headers exist; otherwise the Rust side reports these features absent.

#include <ATen/DeviceAccelerator.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::TraceEntry;

namespace {

// Counted by the trace tracker (which runs under the allocator's lock: atomics only).
std::atomic<uint64_t> trace_events[16];
std::atomic<bool> attached{false};

thread_local std::string last_error_b;

}  // namespace

extern "C" {

struct ms_oom_info {
  int64_t device;
  uint64_t requested_bytes;  // the observer's `alloc` argument: the rounded request
  uint64_t total_bytes;
  uint64_t free_bytes;
  uint64_t reserved_bytes;
  uint64_t stats_allocated_bytes;
  uint64_t inactive_split_bytes;
  uint64_t largest_free_block_bytes;
  int has_stats;
  int has_snapshot;
};

struct ms_segment_summary {
  uint64_t segments;
  uint64_t reserved_bytes;
  uint64_t allocated_bytes;
  uint64_t largest_free_block_bytes;
  uint64_t free_blocks;
};

using OomCallback = void (*)(const ms_oom_info*);

static int summarize(int64_t device, ms_segment_summary* out) {
  auto snap = cca::snapshot({0, 0}, false);
  *out = ms_segment_summary{0, 0, 0, 0, 0};
  for (const auto& seg : snap.segments) {
    if (device >= 0 && seg.device != device) continue;
    out->segments++;
    out->reserved_bytes += seg.total_size;
    out->allocated_bytes += seg.allocated_size;
    for (const auto& b : seg.blocks) {
      if (!b.allocated && !b.active) {
        out->free_blocks++;
        if (b.size > out->largest_free_block_bytes) out->largest_free_block_bytes = b.size;
      }
    }
  }
  return 0;
}

// Attaches the trace tracker (counts events) and the OOM observer, which calls `cb` outside the
// allocator's lock with everything known at that moment. Both live in the per-device allocators,
// which exist only once CUDA is initialised: attaching earlier attaches to nothing (seen on an H100),
// so the caller attaches after the first successful statistics read. Once; later calls return 0.
int ms_cuda_attach(OomCallback cb) {
  if (attached.exchange(true)) return 0;
  try {
    cca::attachAllocatorTraceTracker([](const TraceEntry& t) {
      auto a = static_cast<size_t>(t.action_);
      if (a < 16) trace_events[a].fetch_add(1, std::memory_order_relaxed);
    });
    // The observer's arguments are (device, the rounded request, the device's total or the
    // allowed maximum under a memory fraction, the driver's free bytes).
    cca::attachOutOfMemoryObserver([cb](int64_t device, size_t request, size_t total,
                                        size_t device_free) {
      ms_oom_info info{};
      info.device = device;
      info.requested_bytes = request;
      info.total_bytes = total;
      info.free_bytes = device_free;
      try {
        auto s = at::accelerator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
        auto agg = [](const c10::CachingAllocator::StatArray& a) {
          return a[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
        };
        info.reserved_bytes = agg(s.reserved_bytes);
        info.stats_allocated_bytes = agg(s.allocated_bytes);
        info.inactive_split_bytes = agg(s.inactive_split_bytes);
        info.has_stats = 1;
      } catch (...) {
      }
      try {
        ms_segment_summary seg{};
        summarize(device, &seg);
        info.largest_free_block_bytes = seg.largest_free_block_bytes;
        info.has_snapshot = 1;
      } catch (...) {
      }
      cb(&info);
    });
    return 0;
  } catch (const std::exception& e) {
    attached.store(false);
    last_error_b = e.what();
    return -1;
  } catch (...) {
    attached.store(false);
    return -1;
  }
}

// One segment of the allocator snapshot, for the viewer's segment map: its size, and its blocks
// folded into `cells` equal slices, each holding the allocated share of that slice (0–255).
constexpr int kCells = 32;
struct ms_segment_map {
  uint64_t bytes;
  uint64_t allocated_bytes;
  uint8_t cells[kCells];
};

// The largest `max` segments of `device`, largest first; returns how many were written (-1 on error).
int64_t ms_cuda_segment_map(int64_t device, ms_segment_map* out, size_t max) {
  try {
    auto snap = cca::snapshot({0, 0}, false);
    std::vector<const c10::CachingDeviceAllocator::SegmentInfo*> segs;
    for (const auto& seg : snap.segments)
      if (seg.device == device) segs.push_back(&seg);
    std::sort(segs.begin(), segs.end(),
              [](auto a, auto b) { return a->total_size > b->total_size; });
    size_t n = segs.size() < max ? segs.size() : max;
    for (size_t i = 0; i < n; i++) {
      const auto& seg = *segs[i];
      ms_segment_map& m = out[i];
      m.bytes = seg.total_size;
      m.allocated_bytes = seg.allocated_size;
      double used[kCells] = {0};
      double cell = seg.total_size > 0 ? double(seg.total_size) / kCells : 1.0;
      uint64_t off = 0;
      for (const auto& b : seg.blocks) {
        if (b.allocated) {
          // Spread the block's bytes over the cells it covers.
          uint64_t start = off, end = off + b.size;
          while (start < end) {
            int c = int(start / cell);
            if (c >= kCells) c = kCells - 1;
            uint64_t cell_end = uint64_t((c + 1) * cell);
            if (cell_end <= start) cell_end = start + 1;
            uint64_t take = (end < cell_end ? end : cell_end) - start;
            used[c] += double(take);
            start += take;
          }
        }
        off += b.size;
      }
      for (int c = 0; c < kCells; c++) {
        double f = used[c] / cell;
        m.cells[c] = uint8_t(f >= 1.0 ? 255 : f <= 0.0 ? 0 : f * 255.0);
      }
    }
    return int64_t(n);
  } catch (const std::exception& e) {
    last_error_b = e.what();
    return -1;
  } catch (...) {
    return -1;
  }
}

// Trace events counted so far, indexed by TraceEntry::Action (ALLOC=0 … OOM); n ≤ 16.
void ms_cuda_trace_counts(uint64_t* out, size_t n) {
  for (size_t i = 0; i < n && i < 16; i++) out[i] = trace_events[i].load(std::memory_order_relaxed);
}

}  // extern "C"
