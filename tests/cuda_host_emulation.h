// Just enough of CUDA to run jax_cgtp's generated kernels on the host, for tests without a GPU.
//
// Every thread of a block is a fiber (a ucontext with its own stack), and a block's fibers take
// turns on the calling thread: a fiber runs until it waits at a barrier, then the next one runs.
// A fiber starts from its ucontext once; after that, the switches to and from it are _setjmp and
// _longjmp, which leave the signal mask alone (swapcontext makes a system call for it each time).
// The 32 threads of a warp meet at a barrier for __syncwarp and for each shuffle or ballot (a
// value is published, the warp meets, the source lanes' values are read, the warp meets again),
// and the block's threads at another for __syncthreads. This is exact for code whose warp-synchronous
// operations run in warp-uniform control flow with the full mask, which the generated kernels
// require anyway; a launch where every waiting thread waits forever returns an error.
// Blocks run one after the other, so one static buffer serves as every block's shared memory.
// Timing means nothing here: only the arithmetic and the memory accesses are checked.
#include <sys/mman.h>
#include <ucontext.h>

#include <csetjmp>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

struct cgtp_emu_dim3 {
  unsigned x = 0, y = 0, z = 0;
};

// A barrier of `expected` threads: the last to arrive opens it, the others take turns until then.
struct cgtp_emu_barrier {
  int expected = 0, arrived = 0;
  unsigned long long generation = 0;
};

struct cgtp_emu_warp {
  cgtp_emu_barrier meet{32};
  alignas(8) unsigned char slots[32][8];
};

// A CUDA thread: `start` runs it from the kernel's beginning, `resume` from the barrier it waits at.
struct cgtp_emu_fiber {
  ucontext_t start;
  std::jmp_buf resume;
  bool started = false;
};

inline cgtp_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;  // threadIdx: the running fiber's
inline cgtp_emu_warp* cgtp_emu_my_warp = nullptr;
inline cgtp_emu_barrier* cgtp_emu_block_meet = nullptr;  // the running block's (one block at a time)
inline std::jmp_buf cgtp_emu_scheduler;
inline cgtp_emu_fiber* cgtp_emu_running = nullptr;
inline unsigned long long cgtp_emu_arrivals = 0;  // barrier arrivals so far: progress
inline bool cgtp_emu_waiting = false;  // the fiber that switched back waits at a barrier

alignas(16) unsigned char cgtp_smem[1 << 17];

inline void cgtp_emu_arrive_and_wait(cgtp_emu_barrier& barrier) {
  ++cgtp_emu_arrivals;
  const unsigned long long generation = barrier.generation;
  if (++barrier.arrived == barrier.expected) {
    barrier.arrived = 0;
    ++barrier.generation;
    return;
  }
  while (barrier.generation == generation) {
    cgtp_emu_waiting = true;
    if (!_setjmp(cgtp_emu_running->resume)) _longjmp(cgtp_emu_scheduler, 1);
  }
}

inline void __syncwarp(unsigned = 0xffffffffu) { cgtp_emu_arrive_and_wait(cgtp_emu_my_warp->meet); }
inline void __syncthreads() { cgtp_emu_arrive_and_wait(*cgtp_emu_block_meet); }

template <class V>
inline V __shfl_sync(unsigned, V value, int source) {
  static_assert(sizeof(V) <= 8, "shuffles move at most 8 bytes");
  cgtp_emu_warp& warp = *cgtp_emu_my_warp;
  std::memcpy(warp.slots[threadIdx.x & 31], &value, sizeof(V));
  cgtp_emu_arrive_and_wait(warp.meet);
  V result;
  std::memcpy(&result, warp.slots[source & 31], sizeof(V));
  cgtp_emu_arrive_and_wait(warp.meet);
  return result;
}

template <class V>
inline V __shfl_xor_sync(unsigned mask, V value, int lane_mask) {
  return __shfl_sync(mask, value, static_cast<int>(threadIdx.x & 31) ^ lane_mask);
}

// Bit `l` of the result is lane l's `predicate`; every lane receives the same mask.
inline unsigned __ballot_sync(unsigned, int predicate) {
  cgtp_emu_warp& warp = *cgtp_emu_my_warp;
  warp.slots[threadIdx.x & 31][0] = predicate != 0;
  cgtp_emu_arrive_and_wait(warp.meet);
  unsigned mask = 0;
  for (int l = 0; l < 32; ++l) mask |= static_cast<unsigned>(warp.slots[l][0]) << l;
  cgtp_emu_arrive_and_wait(warp.meet);
  return mask;
}

// Bit `l` of the result is set where lane l's `value` equals this lane's.
template <class V>
inline unsigned __match_any_sync(unsigned, V value) {
  static_assert(sizeof(V) <= 8, "matches compare at most 8 bytes");
  cgtp_emu_warp& warp = *cgtp_emu_my_warp;
  std::memcpy(warp.slots[threadIdx.x & 31], &value, sizeof(V));
  cgtp_emu_arrive_and_wait(warp.meet);
  unsigned mask = 0;
  for (int l = 0; l < 32; ++l) mask |= static_cast<unsigned>(std::memcmp(warp.slots[l], &value, sizeof(V)) == 0) << l;
  cgtp_emu_arrive_and_wait(warp.meet);
  return mask;
}

inline int __popc(unsigned bits) { return __builtin_popcount(bits); }
inline int __ffs(unsigned bits) { return __builtin_ffs(static_cast<int>(bits)); }
inline int __clz(unsigned bits) { return bits ? __builtin_clz(bits) : 32; }

template <class V>
inline V __ldca(const V* address) {  // ld.global.ca: a load cached in L1, to the host a plain one
  return *address;
}

template <class V>
inline V __ldcg(const V* address) {  // ld.global.cg: a load cached in L2 only, to the host a plain one
  return *address;
}

inline void __threadfence() {}  // blocks run one after the other: every store is seen

template <class V>
inline V atomicAdd(V* address, V value) {
  return std::atomic_ref<V>(*address).fetch_add(value);
}

template <class V>
inline V atomicMax(V* address, V value) {
  const V old = *address;  // blocks run one after the other: no other thread writes meanwhile
  if (value > old) *address = value;
  return old;
}

// Run `kernel` (a callable taking no arguments, the kernel call bound to its parameters) on a
// grid of `grid` blocks of `block` threads. Returns 0, or 1 where a block's threads all wait at
// barriers that cannot open (a barrier in divergent control flow).
template <class Kernel>
int cgtp_emu_launch(long long grid, int block, Kernel kernel) {
  constexpr std::size_t stack_bytes = std::size_t{1} << 21;
  gridDim.x = static_cast<unsigned>(grid);
  blockDim.x = static_cast<unsigned>(block);
  const std::size_t bytes = stack_bytes * static_cast<std::size_t>(block);
  void* stacks = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (stacks == MAP_FAILED) return 1;
  static Kernel* body;
  body = &kernel;
  int status = 0;
  for (long long b = 0; b < grid && status == 0; ++b) {
    std::vector<cgtp_emu_warp> warps(block / 32);
    cgtp_emu_barrier block_meet{block};
    cgtp_emu_block_meet = &block_meet;
    blockIdx.x = static_cast<unsigned>(b);
    std::vector<cgtp_emu_fiber> fibers(block);
    std::vector<char> done(block, 0);
    for (int t = 0; t < block; ++t) {
      ucontext_t& start = fibers[t].start;
      getcontext(&start);
      start.uc_stack.ss_sp = static_cast<char*>(stacks) + stack_bytes * t;
      start.uc_stack.ss_size = stack_bytes;
      start.uc_link = nullptr;  // it never returns: it jumps back to the scheduler
      makecontext(&start, +[] {
        (*body)();
        _longjmp(cgtp_emu_scheduler, 1);
      }, 0);
    }
    for (int live = block; live > 0;) {
      const unsigned long long arrivals = cgtp_emu_arrivals;
      const int live_before = live;
      for (int t = 0; t < block; ++t) {
        if (done[t]) continue;
        threadIdx.x = static_cast<unsigned>(t);
        cgtp_emu_my_warp = &warps[t / 32];
        cgtp_emu_running = &fibers[t];
        cgtp_emu_waiting = false;
        if (!_setjmp(cgtp_emu_scheduler)) {
          if (fibers[t].started) _longjmp(fibers[t].resume, 1);
          fibers[t].started = true;
          setcontext(&fibers[t].start);
        }
        done[t] = !cgtp_emu_waiting;  // it returned, or it switched back from a barrier
        live -= done[t];
      }
      if (live == live_before && cgtp_emu_arrivals == arrivals) {
        status = 1;
        break;
      }
    }
  }
  munmap(stacks, bytes);
  return status;
}
