// The simulated GPU's allocator: torch's CPU allocator with counters and the device's capacity.
//
//   python -m simcluster.launcher.instrument.gpu.native --build   (compiles this file; images/Dockerfile does the same)
//
// Loaded with ctypes by gpu/native.py (no Python headers: a plain shared library over libc10).
// simcluster_install() registers, with c10::SetCPUAllocator, an allocator that wraps the one
// registered before it (torch's DefaultCPUAllocator): every CPU allocation of the process then
// passes one door, where a few atomics count it (no cost per op, only per allocation). The blocks
// are torch's own (the data pointer is its own context, Allocator::raw_allocate's rule); a table
// sharded by address holds each one's size for its free. A block allocated before the install and
// freed through this allocator's deleter, or the reverse, is freed by torch's deleter all the same
// (only its count is missed): no pointer ever changes hands between the two.
// Sizes are counted rounded up to CUDA's 512-byte block (kMinBlockSize), as the caching allocator
// counts them. An allocation that would take the allocated bytes above the limit (the device's
// capacity, times set_per_process_memory_fraction) raises c10::OutOfMemoryError with the CUDA
// caching allocator's message and numbers: Python sees torch.cuda.OutOfMemoryError.
// Device marks (--check-devices, gpu/devcheck.py): each block also holds the device it was made for
// (0 unknown, 1 cpu, 2 cuda), the calling thread's mark at its allocation (simcluster_set_making),
// kept in the size's low bits (a multiple of 512) and read with simcluster_device_of: a mark lives
// exactly as long as its block.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <pthread.h>
#include <string>
#include <unordered_map>

namespace {

constexpr int kShards = 64;  // the size table's shards, each with its own lock
constexpr int64_t kBlock = 512;  // CUDA's kMinBlockSize

enum Stat {
  kAllocated, kPeak, kRunPeak, kReserved, kPeakReserved, kTotalAllocated, kTotalFreed,
  kCount, kPeakCount, kTotalCount, kOoms, kNumStats
};

std::atomic<int64_t> g_stats[kNumStats];
std::atomic<int64_t> g_total{0};   // the device's capacity (bytes)
std::atomic<int64_t> g_limit{-1};  // the most bytes allocated at once (capacity x fraction); -1: none
std::atomic<int> g_device{0};      // the current device, named by the message
std::atomic<int> g_fraction_set{0};
c10::Allocator* g_base = nullptr;  // the allocator registered before this one
c10::DeleterFnPtr g_base_delete = nullptr;  // its deleter of a raw block

struct Shard {
  std::mutex lock;
  std::unordered_map<void*, int64_t> sizes;  // block -> its counted (rounded) size
};
Shard g_shards[kShards];
thread_local int t_making = 0;  // the device this thread's allocations are made for (0: unknown)
constexpr int64_t kMarkBits = 3;  // the low bits of a table entry that hold its mark

Shard& shard_of(void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  return g_shards[((a >> 6) ^ (a >> 16)) % kShards];
}

int64_t rounded(size_t n) { return (static_cast<int64_t>(n) + kBlock - 1) / kBlock * kBlock; }

void raise_max(Stat s, int64_t v) {
  int64_t cur = g_stats[s].load(std::memory_order_relaxed);
  while (v > cur && !g_stats[s].compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

std::string format_size(int64_t size) {  // the caching allocator's format: bytes, KiB, MiB, GiB
  char buf[64];
  double s = static_cast<double>(size);
  if (size <= 1024) {
    std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(size));
  } else if (size <= 1048576) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", s / 1024.0);
  } else if (size <= 1073741824LL) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", s / 1048576.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", s / 1073741824.0);
  }
  return buf;
}

[[noreturn]] void out_of_memory(int64_t size, int64_t allocated) {
  g_stats[kOoms].fetch_add(1, std::memory_order_relaxed);
  int64_t total = g_total.load(), reserved = g_stats[kReserved].load();
  if (reserved < allocated) reserved = allocated;
  int64_t free_bytes = total > reserved ? total - reserved : 0;
  std::string allowed = g_fraction_set.load() ? format_size(g_limit.load()) + " allowed; " : "";
  TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ", format_size(size), ". GPU ",
                   g_device.load(), " has a total capacity of ", format_size(total), " of which ",
                   format_size(free_bytes), " is free. Including non-PyTorch memory, this process has ",
                   format_size(reserved), " memory in use. ", allowed, "Of the allocated memory ",
                   format_size(allocated), " is allocated by PyTorch, and ", format_size(reserved - allocated),
                   " is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
                   "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
                   "documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/"
                   "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf) [simcluster: the simulated "
                   "GPU's capacity; --gpu-memory SIZE sets it]");
}

void count_free(void* data) {
  if (data == nullptr) return;
  int64_t n = -1;
  {
    Shard& sh = shard_of(data);
    std::lock_guard<std::mutex> guard(sh.lock);
    auto it = sh.sizes.find(data);
    if (it != sh.sizes.end()) {
      n = it->second & ~kMarkBits;
      sh.sizes.erase(it);
    }
  }
  if (n >= 0) {
    g_stats[kAllocated].fetch_sub(n, std::memory_order_relaxed);
    g_stats[kTotalFreed].fetch_add(n, std::memory_order_relaxed);
    g_stats[kCount].fetch_sub(1, std::memory_order_relaxed);
  }
  g_base_delete(data);
}

// fork() while another thread holds a shard's lock (a DataLoader's worker forked beside gloo's
// threads) would leave it locked in the child: every lock is taken around a fork, as glibc's malloc does.
void lock_all() {
  for (auto& sh : g_shards) sh.lock.lock();
}
void unlock_all() {
  for (auto& sh : g_shards) sh.lock.unlock();
}

struct CountingAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return g_base->allocate(0);  // no block, as CUDA: not counted
    int64_t n = rounded(nbytes);
    int64_t now = g_stats[kAllocated].fetch_add(n, std::memory_order_relaxed) + n;
    int64_t limit = g_limit.load(std::memory_order_relaxed);
    if (limit >= 0 && now > limit) {
      g_stats[kAllocated].fetch_sub(n, std::memory_order_relaxed);
      out_of_memory(n, now - n);
    }
    void* data;
    try {
      data = g_base->raw_allocate(nbytes);
    } catch (...) {
      g_stats[kAllocated].fetch_sub(n, std::memory_order_relaxed);
      throw;
    }
    {
      Shard& sh = shard_of(data);
      std::lock_guard<std::mutex> guard(sh.lock);
      sh.sizes[data] = n | t_making;
    }
    g_stats[kTotalAllocated].fetch_add(n, std::memory_order_relaxed);
    int64_t count = g_stats[kCount].fetch_add(1, std::memory_order_relaxed) + 1;
    g_stats[kTotalCount].fetch_add(1, std::memory_order_relaxed);
    raise_max(kPeak, now);
    raise_max(kRunPeak, now);
    raise_max(kReserved, now);
    raise_max(kPeakReserved, now);
    raise_max(kPeakCount, count);
    return {data, data, &count_free, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &count_free; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

CountingAllocator g_allocator;

}  // namespace

extern "C" {

// Register the counting allocator (once); 1 if it is now torch's CPU allocator, 0 if another
// allocator of a higher priority keeps the place or the one there frees no raw block.
int simcluster_install(int64_t total) {
  g_total.store(total);
  if (c10::GetCPUAllocator() == &g_allocator) return 1;
  c10::Allocator* base = c10::GetCPUAllocator();
  if (base->raw_deleter() == nullptr) return 0;  // its blocks need their context: not wrapped
  g_base_delete = base->raw_deleter();
  g_base = base;
  pthread_atfork(&lock_all, &unlock_all, &unlock_all);
  c10::SetCPUAllocator(&g_allocator, 200);
  return c10::GetCPUAllocator() == &g_allocator ? 1 : 0;
}

int64_t simcluster_stat(int which) { return which >= 0 && which < kNumStats ? g_stats[which].load() : -1; }

void simcluster_set_stat(int which, int64_t value) {
  if (which >= 0 && which < kNumStats) g_stats[which].store(value);
}

void simcluster_set_limit(int64_t total, int64_t limit, int fraction_set) {
  g_total.store(total);
  g_limit.store(limit);
  g_fraction_set.store(fraction_set);
}

void simcluster_set_device(int device) { g_device.store(device); }

// The mark of this thread's next allocations (0 unknown, 1 cpu, 2 cuda).
void simcluster_set_making(int device) { t_making = device & kMarkBits; }

// The mark of the block at ``data`` (a storage's base pointer); 0 for a block not made here.
int simcluster_device_of(void* data) {
  if (data == nullptr) return 0;
  Shard& sh = shard_of(data);
  std::lock_guard<std::mutex> guard(sh.lock);
  auto it = sh.sizes.find(data);
  return it == sh.sizes.end() ? 0 : static_cast<int>(it->second & kMarkBits);
}

}  // extern "C"
