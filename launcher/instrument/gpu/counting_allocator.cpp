// The simulated GPU's allocator: torch's CPU allocator with counters and the device's capacity.
//
//   python -m simcluster.launcher.instrument.gpu.native --build   (compiles this file; images/Dockerfile does the same)
//
// Loaded with ctypes by gpu/native.py (no Python headers: a plain shared library over libc10).
// simcluster_install() registers, with c10::SetCPUAllocator, an allocator that wraps the one
// registered before it (torch's DefaultCPUAllocator): every CPU allocation of the process then
// passes one door, where it is counted (no cost per op, only per allocation). The blocks are torch's
// own (the data pointer is its own context, Allocator::raw_allocate's rule); a table holds each
// one's size for its free. A block allocated before the install and freed through this allocator's
// deleter, or the reverse, is freed by torch's deleter all the same (only its count is missed).
// A count's cost (issue 53; BENCHMARKS.md, "The allocator's count without a node"): one spin lock
// per allocation and per free, under which the table (open addressing: no node allocated) and the
// statistics (plain stores, peaks compared) are updated; the statistics are read without it.
// Sizes are counted rounded up to CUDA's 512-byte block (kMinBlockSize), as the caching allocator
// counts them. An allocation that would take the allocated bytes above the limit (the device's
// capacity, times set_per_process_memory_fraction) raises c10::OutOfMemoryError with the CUDA
// caching allocator's message and numbers: Python sees torch.cuda.OutOfMemoryError (the verdict is
// given under the lock once torch's block is made; a request over the limit before that makes none).
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
#include <sched.h>
#include <sys/mman.h>
#include <string>

namespace {

constexpr int64_t kBlock = 512;  // CUDA's kMinBlockSize
constexpr int64_t kMarkBits = 3;  // the low bits of a table entry that hold its mark
constexpr int kFirstBits = 12;  // the table's first capacity: 2^12 blocks (64 KiB)

enum Stat {
  kAllocated, kPeak, kRunPeak, kReserved, kPeakReserved, kTotalAllocated, kTotalFreed,
  kCount, kPeakCount, kTotalCount, kOoms, kNumStats
};

// A lock of two instructions (an exchange; a store to release): the work under it is a table probe and
// a few additions. A holder that is descheduled (a loaded machine) makes the waiters yield, not spin.
class SpinLock {
 public:
  void lock() {
    while (held_.exchange(true, std::memory_order_acquire)) {
      for (int spins = 0; held_.load(std::memory_order_relaxed); ++spins) {
        if (spins >= 64) {
          sched_yield();
          spins = 0;
        }
      }
    }
  }
  void unlock() { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

SpinLock g_lock;  // guards the table and every write to g_stats and g_limit
std::atomic<int64_t> g_stats[kNumStats];  // read without the lock; written under it
std::atomic<int64_t> g_total{0};   // the device's capacity (bytes)
std::atomic<int64_t> g_limit{-1};  // the most bytes allocated at once (capacity x fraction); -1: none
std::atomic<int> g_device{0};      // the current device, named by the message
std::atomic<int> g_fraction_set{0};
c10::Allocator* g_base = nullptr;  // the allocator registered before this one
c10::DeleterFnPtr g_base_delete = nullptr;  // its deleter of a raw block
thread_local int t_making = 0;  // the device this thread's allocations are made for (0: unknown)
std::atomic<bool> g_marking{false};  // a mark ever set; else t_making is not read (a __tls_get_addr call)

int64_t get(Stat s) { return g_stats[s].load(std::memory_order_relaxed); }
void put(Stat s, int64_t v) { g_stats[s].store(v, std::memory_order_relaxed); }  // under g_lock
void add(Stat s, int64_t d) { put(s, get(s) + d); }                               // under g_lock
void raise_to(Stat s, int64_t v) { if (v > get(s)) put(s, v); }                  // under g_lock

// Block -> its counted size | mark: open addressing over a power-of-two array, linear probing,
// backward-shift deletion (no tombstone), doubled at half full; an empty slot's key is nullptr (no
// block is at address 0). Every function below holds g_lock.
struct Slot {
  void* key;
  int64_t value;
};
Slot* g_slots = nullptr;
int g_bits = 0;
size_t g_used = 0;

size_t home(void* p, int bits) {  // Fibonacci hashing of the address above its 64-byte alignment
  return static_cast<size_t>((reinterpret_cast<uintptr_t>(p) >> 6) * 0x9E3779B97F4A7C15ull >> (64 - bits));
}

// The table's pages are mapped apart from malloc's heap: a table there changed where torch's
// blocks fell, and freeing a block next to the heap's top then cost a consolidation of it (40 ns).
bool grow() {  // double the table (or make the first one); false when the memory is not there
  int bits = g_slots == nullptr ? kFirstBits : g_bits + 1;
  size_t mask = (size_t{1} << bits) - 1;
  void* pages = mmap(nullptr, (mask + 1) * sizeof(Slot), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (pages == MAP_FAILED) return false;
  auto* slots = static_cast<Slot*>(pages);  // zeroed: every slot empty
  for (size_t i = 0; g_slots != nullptr && i < (size_t{1} << g_bits); ++i) {
    if (g_slots[i].key == nullptr) continue;
    size_t j = home(g_slots[i].key, bits);
    while (slots[j].key != nullptr) j = (j + 1) & mask;
    slots[j] = g_slots[i];
  }
  if (g_slots != nullptr) munmap(g_slots, (size_t{1} << g_bits) * sizeof(Slot));
  g_slots = slots;
  g_bits = bits;
  return true;
}

size_t find(void* p) {  // the slot of p, or the empty slot that ends its probe
  size_t mask = (size_t{1} << g_bits) - 1;
  size_t i = home(p, g_bits);
  while (g_slots[i].key != nullptr && g_slots[i].key != p) i = (i + 1) & mask;
  return i;
}

bool insert(void* p, int64_t value) {  // p's entry set (a stale one overwritten); false: no memory
  if ((g_used + 1) * 2 > (size_t{1} << g_bits) && !grow()) return false;
  size_t i = find(p);
  if (g_slots[i].key == nullptr) ++g_used;
  g_slots[i] = {p, value};
  return true;
}

int64_t lookup(void* p) {  // p's value, or -1 when it is not in the table
  if (g_slots == nullptr) return -1;
  size_t i = find(p);
  return g_slots[i].key == nullptr ? -1 : g_slots[i].value;
}

int64_t erase(void* p) {  // remove p's entry; its value, or -1 when it had none
  if (g_slots == nullptr) return -1;
  size_t mask = (size_t{1} << g_bits) - 1;
  size_t hole = find(p);
  if (g_slots[hole].key == nullptr) return -1;
  int64_t value = g_slots[hole].value;
  // Backward shift: each later entry of the run moves into the hole unless its home lies
  // cyclically after the hole (in (hole, j]): then it is already where its probe would find it.
  for (size_t j = (hole + 1) & mask; g_slots[j].key != nullptr; j = (j + 1) & mask) {
    size_t h = home(g_slots[j].key, g_bits);
    if (((j - h) & mask) >= ((j - hole) & mask)) {
      g_slots[hole] = g_slots[j];
      hole = j;
    }
  }
  g_slots[hole].key = nullptr;
  --g_used;
  return value;
}

int64_t rounded(size_t n) { return (static_cast<int64_t>(n) + kBlock - 1) / kBlock * kBlock; }

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

[[noreturn]] void out_of_memory(int64_t size, int64_t allocated, int64_t reserved) {  // after unlocking
  int64_t total = g_total.load();
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
  {
    std::lock_guard<SpinLock> guard(g_lock);
    int64_t n = erase(data);
    if (n >= 0) {
      n &= ~kMarkBits;
      add(kAllocated, -n);
      add(kTotalFreed, n);
      add(kCount, -1);
    }
  }
  g_base_delete(data);
}

// Whether n more bytes would pass the limit: exact under g_lock, a hint without it.
bool over_limit(int64_t n) {
  int64_t limit = g_limit.load(std::memory_order_relaxed);
  return limit >= 0 && get(kAllocated) + n > limit;
}

struct CountingAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return g_base->allocate(0);  // no block, as CUDA: not counted
    int64_t n = rounded(nbytes);
    for (;;) {  // twice only when a free on another thread made room between the hint and the lock
      void* data = over_limit(n) ? nullptr : g_base->raw_allocate(nbytes);  // none made when refused
      int64_t mark = g_marking.load(std::memory_order_relaxed) ? t_making : 0;
      int64_t allocated, reserved;
      bool over, counted = false;
      {
        std::lock_guard<SpinLock> guard(g_lock);
        allocated = get(kAllocated);
        reserved = get(kReserved);
        over = over_limit(n);
        if (over) {
          add(kOoms, 1);
        } else if (data != nullptr && insert(data, n | mark)) {
          counted = true;
          int64_t now = allocated + n, count = get(kCount) + 1;
          put(kAllocated, now);
          add(kTotalAllocated, n);
          put(kCount, count);
          add(kTotalCount, 1);
          raise_to(kPeak, now);
          raise_to(kRunPeak, now);
          raise_to(kReserved, now);
          raise_to(kPeakReserved, now);
          raise_to(kPeakCount, count);
        }
      }
      if (counted) return {data, data, &count_free, c10::Device(c10::DeviceType::CPU)};
      if (data != nullptr) g_base_delete(data);
      if (over) out_of_memory(n, allocated, reserved);
      TORCH_CHECK(data == nullptr, "simcluster: the simulated GPU's table of blocks could not grow (host out of memory)");
    }
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
  // fork() while another thread holds the lock (a DataLoader's worker forked beside gloo's threads)
  // would leave it locked in the child: it is taken around a fork, as glibc's malloc does its own.
  pthread_atfork([] { g_lock.lock(); }, [] { g_lock.unlock(); }, [] { g_lock.unlock(); });
  c10::SetCPUAllocator(&g_allocator, 200);
  return c10::GetCPUAllocator() == &g_allocator ? 1 : 0;
}

int64_t simcluster_stat(int which) { return which >= 0 && which < kNumStats ? g_stats[which].load() : -1; }

void simcluster_set_stat(int which, int64_t value) {
  std::lock_guard<SpinLock> guard(g_lock);
  if (which >= 0 && which < kNumStats) put(static_cast<Stat>(which), value);
}

void simcluster_set_limit(int64_t total, int64_t limit, int fraction_set) {
  std::lock_guard<SpinLock> guard(g_lock);
  g_total.store(total);
  g_limit.store(limit);
  g_fraction_set.store(fraction_set);
}

void simcluster_set_device(int device) { g_device.store(device); }

// The mark of this thread's next allocations (0 unknown, 1 cpu, 2 cuda).
void simcluster_set_making(int device) {
  if (device != 0) g_marking.store(true, std::memory_order_relaxed);
  t_making = device & kMarkBits;
}

// The mark of the block at ``data`` (a storage's base pointer); 0 for a block not made here.
int simcluster_device_of(void* data) {
  if (data == nullptr) return 0;
  std::lock_guard<SpinLock> guard(g_lock);
  int64_t value = lookup(data);
  return value < 0 ? 0 : static_cast<int>(value & kMarkBits);
}

}  // extern "C"
