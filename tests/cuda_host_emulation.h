// Just enough of CUDA to run jax_cgtp's generated kernels on the host, for tests without a GPU.
//
// Every thread of a block is a std::thread; the 32 threads of a warp meet at a std::barrier for
// __syncwarp and for each shuffle (a value is published, the warp meets, the source lane's value
// is read, the warp meets again), and the block's threads at another for __syncthreads. This is
// exact for code whose warp-synchronous operations run in warp-uniform control flow with the full
// mask, which the generated kernels require anyway.
// Blocks run one after the other, so one static buffer serves as every block's shared memory.
// Timing means nothing here: only the arithmetic and the memory accesses are checked.
#include <atomic>
#include <barrier>
#include <cstring>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

struct cgtp_emu_dim3 {
  unsigned x = 0, y = 0, z = 0;
};

struct cgtp_emu_warp {
  std::barrier<> meet{32};
  alignas(8) unsigned char slots[32][8];
};

inline thread_local cgtp_emu_dim3 threadIdx, blockIdx;
inline cgtp_emu_dim3 blockDim, gridDim;
inline thread_local cgtp_emu_warp* cgtp_emu_my_warp = nullptr;
inline std::barrier<>* cgtp_emu_block_meet = nullptr;  // the running block's (one block at a time)

alignas(16) unsigned char cgtp_smem[1 << 17];

inline void __syncwarp(unsigned = 0xffffffffu) { cgtp_emu_my_warp->meet.arrive_and_wait(); }
inline void __syncthreads() { cgtp_emu_block_meet->arrive_and_wait(); }

template <class V>
inline V __shfl_sync(unsigned, V value, int source) {
  static_assert(sizeof(V) <= 8, "shuffles move at most 8 bytes");
  cgtp_emu_warp& warp = *cgtp_emu_my_warp;
  std::memcpy(warp.slots[threadIdx.x & 31], &value, sizeof(V));
  warp.meet.arrive_and_wait();
  V result;
  std::memcpy(&result, warp.slots[source & 31], sizeof(V));
  warp.meet.arrive_and_wait();
  return result;
}

template <class V>
inline V __shfl_xor_sync(unsigned mask, V value, int lane_mask) {
  return __shfl_sync(mask, value, static_cast<int>(threadIdx.x & 31) ^ lane_mask);
}

template <class V>
inline V __ldca(const V* address) {  // ld.global.ca: a load cached in L1, to the host a plain one
  return *address;
}

template <class V>
inline V atomicAdd(V* address, V value) {
  return std::atomic_ref<V>(*address).fetch_add(value);
}

// Run `kernel` (a callable taking no arguments, the kernel call bound to its parameters) on a
// grid of `grid` blocks of `block` threads.
template <class Kernel>
void cgtp_emu_launch(long long grid, int block, Kernel kernel) {
  gridDim.x = static_cast<unsigned>(grid);
  blockDim.x = static_cast<unsigned>(block);
  for (long long b = 0; b < grid; ++b) {
    std::vector<cgtp_emu_warp> warps(block / 32);
    std::barrier<> block_meet(block);
    cgtp_emu_block_meet = &block_meet;
    std::vector<std::thread> threads;
    threads.reserve(block);
    for (int t = 0; t < block; ++t) {
      threads.emplace_back([&, t] {
        threadIdx.x = static_cast<unsigned>(t);
        blockIdx.x = static_cast<unsigned>(b);
        cgtp_emu_my_warp = &warps[t / 32];
        kernel();
      });
    }
    for (auto& thread : threads) thread.join();
  }
}
