// Device helpers shared by every generated jax_cgtp kernel (see jax_cgtp/gpu/codegen.py).
//
// The generated code defines `T` (the float type, float or double) and `I` (the index type, int
// or long long) before including this file. A warp owns one tile of edges at a time; these helpers
// move a block chunk of 32 rows between global memory and the warp's shared-memory buffer with
// coalesced accesses, and write results with one of three flush operations.

#define CGTP_FULL_MASK 0xffffffffu

// `p`, its loads marked evict-first in L2 (rows read once, which then leave the rows that are
// read again in L2). The loads stay ordinary loads to the compiler.
__device__ __forceinline__ const T* cgtp_evict_first(const T* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return static_cast<const T*>(__nv_associate_access_property(p, policy));
#else
  return p;
#endif
}

// Where element `q` of contiguous rows of `S` elements lies in shared-memory rows of `SP` elements
// (SP odd, so that lane-strided reads hit distinct banks).
template <int S, int SP>
__device__ __forceinline__ int cgtp_staged(int q) {
  return (SP == S) ? q : (q / S) * SP + q % S;
}

// Copy `count` contiguous elements (rows of `S` elements, at most 32 rows) into shared memory
// rows of `SP` elements.
template <int S, int SP>
__device__ __forceinline__ void cgtp_stage(T* __restrict__ dst, const T* __restrict__ src, int count,
                                           int lane) {
#pragma unroll
  for (int r = 0; r < S; ++r) {
    const int q = r * 32 + lane;
    if (q < count) dst[cgtp_staged<S, SP>(q)] = src[q];
  }
}

// The same copy split in two, so that the loads can be issued one edge ahead of their use: the
// coalesced elements of a chunk into registers (`raw[r]` = element `r * 32 + lane`, zero past
// `count` or when `ok` is false), then, later, from registers into the staging rows.
template <int S>
__device__ __forceinline__ void cgtp_fetch(T (&raw)[S], const T* __restrict__ src, int count, int lane,
                                           bool ok) {
#pragma unroll
  for (int r = 0; r < S; ++r) {
    const int q = r * 32 + lane;
    raw[r] = (ok && q < count) ? src[q] : T(0);
  }
}

template <int S, int SP>
__device__ __forceinline__ void cgtp_unpack(T* __restrict__ dst, const T (&raw)[S], int lane) {
#pragma unroll
  for (int r = 0; r < S; ++r) {
    dst[cgtp_staged<S, SP>(r * 32 + lane)] = raw[r];
  }
}

// The lane index, read from the hardware register at each call. Code inside a loop that takes
// its addresses from it keeps them out of registers: from a loop-invariant `lane`, a compiler
// may hoist every address of the loop body out of the loop and hold them all across it.
__device__ __forceinline__ int cgtp_lane() {
#if defined(__CUDA_ARCH__)
  int lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
#else
  return static_cast<int>(threadIdx.x & 31);
#endif
}

// Asynchronous copy of `N` contiguous elements (rows of `S` elements) into shared-memory rows of
// `SP` elements, issued by the warp's lanes together (cp.async: the data lands in shared memory
// without passing through registers), then a commit that closes the group of copies a lane
// issued, and a wait until at most `PENDING` of the lane's latest groups are still in flight. A
// lane sees the other lanes' copies after its own wait and a __syncwarp. Unpadded rows are copied
// as one run of elements, padded rows row by row: either way each lane's addresses are its
// element's plus constants. On the host (the kernel emulation of the tests) the copy is plain.
__device__ __forceinline__ void cgtp_copy_element(T* to, const T* from) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(to));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(address), "l"(from), "n"(sizeof(T)) : "memory");
#else
  *to = *from;
#endif
}

// The same for `V` consecutive elements of 16 bytes together (cp.async.cg: a 16-byte copy, which
// bypasses L1): both addresses are multiples of 16 bytes.
template <int V>
__device__ __forceinline__ void cgtp_copy_vector(T* to, const T* from) {
  static_assert(V * sizeof(T) == 16, "a vector copy moves 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(to));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(from) : "memory");
#else
  for (int v = 0; v < V; ++v) to[v] = from[v];
#endif
}

// `N` contiguous elements (N a multiple of `V`), `V` at a time, the warp's lanes together.
template <int N, int V>
__device__ __forceinline__ void cgtp_copy_vectors(T* __restrict__ dst, const T* __restrict__ src, int lane) {
#pragma unroll
  for (int q = 0; q < N; q += 32 * V) {
    if (q + lane * V < N) cgtp_copy_vector<V>(dst + q + lane * V, src + q + lane * V);
  }
}

template <int N, int S, int SP>
__device__ __forceinline__ void cgtp_copy_async(T* __restrict__ dst, const T* __restrict__ src, int lane) {
  if (SP == S) {
#pragma unroll
    for (int q = 0; q < N; q += 32) {
      if (q + lane < N) cgtp_copy_element(dst + q + lane, src + q + lane);
    }
  } else {
#pragma unroll
    for (int r = 0; r < N / S; ++r) {
#pragma unroll
      for (int c = 0; c < S; c += 32) {
        if (c + lane < S) cgtp_copy_element(dst + r * SP + c + lane, src + r * S + c + lane);
      }
    }
  }
}

// Zeros where `cgtp_copy_async<N, S, SP>` would copy: the slot of an edge whose values are never read.
template <int N, int S, int SP>
__device__ __forceinline__ void cgtp_zero_rows(T* __restrict__ dst, int lane) {
#pragma unroll
  for (int r = 0; r < N / S; ++r) {
    for (int c = lane; c < S; c += 32) dst[r * SP + c] = T(0);
  }
}

// The same as `cgtp_stage` (`count` elements, rows of `S` into rows of `SP`), copied asynchronously.
template <int S, int SP>
__device__ __forceinline__ void cgtp_stage_async(T* __restrict__ dst, const T* __restrict__ src, int count, int lane) {
#pragma unroll
  for (int r = 0; r < S; ++r) {
    const int q = r * 32 + lane;
    if (q < count) cgtp_copy_element(dst + cgtp_staged<S, SP>(q), src + q);
  }
}

__device__ __forceinline__ void cgtp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int PENDING>
__device__ __forceinline__ void cgtp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
#endif
}

// Flush operations: plain store (the row belongs to this edge), owned (the row belongs to this
// warp, which walks its node's sorted run: the run's first chunk of edges stores, later chunks add),
// reduction (the element belongs to this lane: a shared operand's per-warp partial row), atomic add
// (rows shared between warps).
// A reduction is an atomic add whose result is unused (a RED instruction): unlike `*p += v` it does
// not stall the warp until the old value arrives, and one lane's reductions of one address apply in
// program order, so the partial sums stay bitwise reproducible.
__device__ __forceinline__ void cgtp_store(T* p, T v) { *p = v; }
__device__ __forceinline__ void cgtp_own(T* p, T v, bool fresh) { *p = fresh ? v : *p + v; }
__device__ __forceinline__ void cgtp_red(T* p, T v) { atomicAdd(p, v); }
__device__ __forceinline__ void cgtp_atomic(T* p, T v) { atomicAdd(p, v); }

// Sum over the 32 lanes; every lane receives the total.
__device__ __forceinline__ T cgtp_warp_sum(T v) {
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(CGTP_FULL_MASK, v, s);
  return v;
}

// An index is valid when it lies in [0, rows).
__device__ __forceinline__ bool cgtp_valid(long long index, long long rows) {
  return index >= 0 && index < rows;
}

// The sorted positions [begin, end) of run `seg` of a walk over sorted runs: node `seg`'s edges
// from the offsets `off` (rows + 1 entries), and none for `seg` at or past `rows`.
__device__ __forceinline__ void cgtp_run(const I* __restrict__ off, long long seg, long long rows,
                                         long long& begin, long long& end) {
  begin = seg < rows ? (long long)off[seg] : 0;
  end = seg < rows ? (long long)off[seg + 1] : 0;
}

// The chunk of `chunk` edges that starts among the sorted positions [slot * chunk, slot * chunk + chunk)
// and is not its run's first, if there is one (in every lane; the warp's lanes search together): its
// node and its positions [begin, end). Chunk k of the run of `node` starts at off[node] + k * chunk,
// and two starts with k >= 1 lie at least `chunk` apart, so a window holds at most one.
__device__ __forceinline__ bool cgtp_chunk(const I* __restrict__ off, long long rows, long long slot,
                                           long long chunk, int lane, long long& node, long long& begin,
                                           long long& end) {
  const long long p = slot * chunk;
  if (rows <= 0 || p < (long long)off[0] || p >= (long long)off[rows]) return false;
  long long lo = 0, hi = rows;  // off[lo] <= p < off[hi]: 32 probes per step
  while (hi - lo > 1) {
    const long long stride = (hi - lo + 31) / 32;
    const long long probe = lo + lane * stride;
    const unsigned at_or_below = __ballot_sync(CGTP_FULL_MASK, probe < hi && (long long)off[probe] <= p);
    lo += (31 - __clz(at_or_below)) * stride;  // lane 0 probes lo, which is at or below p
    hi = lo + stride < hi ? lo + stride : hi;
  }
  node = lo;
  const long long run_begin = off[lo], run_end = off[lo + 1];
  const long long k = (p - run_begin + chunk - 1) / chunk;
  begin = run_begin + k * chunk;
  end = begin + chunk < run_end ? begin + chunk : run_end;
  return k >= 1 && begin < run_end;
}

// Where a tiled deterministic forward stores node `node`'s sum over tile `tile` (sorted positions
// [first, first + count)): the node's own row of `out` when its run lies inside the tile, else the
// tile's partial row 2 * tile for a run that began before the tile, 2 * tile + 1 for one that starts
// in it and goes on past it (rows of `dim` elements).
__device__ __forceinline__ T* cgtp_tile_row(T* out, T* tile_rows, const I* __restrict__ off, long long node,
                                            long long tile, long long first, long long count, long long dim) {
  const long long begin = (long long)off[node], end = (long long)off[node + 1];
  if (begin >= first && end <= first + count) return out + node * dim;
  return tile_rows + (2 * tile + (begin < first ? 0 : 1)) * dim;
}

// `sum` plus column[row * dim] for the `count` rows from `first` on, added in that order; the loads
// go eight rows ahead.
__device__ __forceinline__ T cgtp_add_rows_in_order(T sum, const T* __restrict__ column, long long first,
                                                    long long count, long long dim) {
  long long row = first;
  for (; row + 8 <= first + count; row += 8) {
    T v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = column[(row + j) * dim];
#pragma unroll
    for (int j = 0; j < 8; ++j) sum += v[j];
  }
  for (; row < first + count; ++row) sum += column[row * dim];
  return sum;
}

// The longest of the `warps` runs from `seg` on (the runs a block's warps walk in step), in
// every lane.
__device__ __forceinline__ long long cgtp_longest_run(const I* __restrict__ off, long long seg, int warps,
                                                      long long rows, int lane) {
  long long begin = 0, end = 0;
  if (lane < warps) cgtp_run(off, seg + lane, rows, begin, end);
  long long longest = end - begin;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    const long long other = __shfl_xor_sync(CGTP_FULL_MASK, longest, m);
    longest = other > longest ? other : longest;
  }
  return longest;
}
