// Edges grouped by an index on the GPU (a counting sort), for jax_cgtp/gpu/grouping_kernels.py.
//
// The generated code defines `I` (int or long long, the index type), CGTP_GROUP_BLOCK (threads per
// block) and CGTP_SCAN_ITEMS (counts per thread of a scan tile) before this text. Bucket 0 holds the
// edges whose index is below 0, bucket n + 1 those of node n < rows, bucket rows + 1 those at or
// above rows. `state` (zeroed before the first launch) holds the count of each of the rows + 2
// buckets, then a flag set where an edge lies in a lower bucket than the edge before it, then the
// number of blocks done counting. `offsets[n] = counts[0] + ... + counts[n]` (n <= rows, CSR over
// nodes) comes in tiles of CGTP_GROUP_BLOCK * CGTP_SCAN_ITEMS counts; `offsets[rows + 1]` is the
// longest run: the largest count of buckets 1 ... rows (0 where rows is 0).
//
//   cgtp_group_count: each edge takes the next rank of its bucket (the lanes of a warp that share
//     a bucket take consecutive ranks by one atomic add on the bucket's count) and compares its
//     bucket with its predecessor's; the block that finishes last sums the counts into `offsets`,
//     tile after tile, and finds the longest run (grouping.py launches it where the counts are one
//     tile).
//   cgtp_group_rank and cgtp_group_scan: the same in two launches, the tiles summed by as many
//     blocks, each adding the sums of the tiles before it as they are published (a single-pass
//     scan with decoupled look-back); each block adds its tile's longest run to a maximum, which
//     the block that finishes last writes.
//   cgtp_group_place: perm[start of the edge's bucket + its rank] = edge. Where no edge's bucket is
//     below its predecessor's, the edges came grouped already and perm is the identity.

extern __shared__ __align__(16) unsigned char cgtp_smem[];

__device__ __forceinline__ long long cgtp_bucket(long long i, long long rows) {
  return i < 0 ? 0 : i < rows ? i + 1 : rows + 1;
}

__device__ __forceinline__ int cgtp_take(int* count, int n = 1) { return atomicAdd(count, n); }
__device__ __forceinline__ long long cgtp_take(long long* count, long long n = 1) {
  return (long long)atomicAdd(reinterpret_cast<unsigned long long*>(count), (unsigned long long)n);
}

// The sum of `value` over the block's threads up to and including this one; `total` gets the
// sum over the whole block. `warp_sums` holds one I per warp of shared memory.
__device__ __forceinline__ I cgtp_block_inclusive_sum(I value, I* warp_sums, I& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int d = 1; d < 32; d <<= 1) {
    const I below = __shfl_sync(0xffffffffu, value, lane >= d ? lane - d : lane);
    if (lane >= d) value += below;
  }
  if (lane == 31) warp_sums[warp] = value;
  __syncthreads();
  if (warp == 0) {
    I sum = lane < warps ? warp_sums[lane] : (I)0;
    for (int d = 1; d < 32; d <<= 1) {
      const I below = __shfl_sync(0xffffffffu, sum, lane >= d ? lane - d : lane);
      if (lane >= d) sum += below;
    }
    if (lane < warps) warp_sums[lane] = sum;
  }
  __syncthreads();
  total = warp_sums[warps - 1];
  const I inclusive = value + (warp > 0 ? warp_sums[warp - 1] : (I)0);
  __syncthreads();  // every thread has read warp_sums before its next use
  return inclusive;
}

// The largest `value` over the block's threads, in every thread. `warp_slots` holds one I per warp
// of shared memory.
__device__ __forceinline__ I cgtp_block_max(I value, I* warp_slots) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int m = 16; m > 0; m >>= 1) {
    const I other = __shfl_xor_sync(0xffffffffu, value, m);
    value = other > value ? other : value;
  }
  if (lane == 0) warp_slots[warp] = value;
  __syncthreads();
  I largest = warp_slots[0];
  for (int k = 1; k < warps; ++k) largest = warp_slots[k] > largest ? warp_slots[k] : largest;
  __syncthreads();  // every thread has read warp_slots before its next use
  return largest;
}

// One scan tile: this thread's counts of the tile that starts at `first`.
struct cgtp_tile {
  long long mine;  // the first count of this thread
  I items[CGTP_SCAN_ITEMS];
  I sum;  // of items
  I longest;  // the largest of items that count a node's edges (buckets 1 ... rows)
};

__device__ __forceinline__ cgtp_tile cgtp_load_tile(const I* counts, long long first, long long rows) {
  cgtp_tile tile;
  tile.mine = first + (long long)CGTP_SCAN_ITEMS * threadIdx.x;
  tile.sum = 0;
  tile.longest = 0;
#pragma unroll
  for (int k = 0; k < CGTP_SCAN_ITEMS; ++k) {
    tile.items[k] = tile.mine + k <= rows ? __ldcg(counts + tile.mine + k) : (I)0;  // others' adds: from L2
    tile.sum += tile.items[k];
    if (tile.mine + k >= 1 && tile.items[k] > tile.longest) tile.longest = tile.items[k];
  }
  return tile;
}

// offsets of the tile's counts, given `before`: the sum of the counts before this thread's.
__device__ __forceinline__ void cgtp_store_tile(const cgtp_tile& tile, I before, I* offsets, long long rows) {
#pragma unroll
  for (int k = 0; k < CGTP_SCAN_ITEMS; ++k) {
    before += tile.items[k];
    if (tile.mine + k <= rows) offsets[tile.mine + k] = before;
  }
}

// Each edge's rank in its bucket, counted in `state`, and the order flag. Returns whether this
// block is the last to finish counting (where `count_blocks`).
__device__ __forceinline__ bool cgtp_rank_edges(const I* index, I* rank, I* state, long long num_edges,
                                                long long rows, bool count_blocks) {
  volatile I* const descending = state + rows + 2;  // a flag that warps only ever set
  I* const shared = reinterpret_cast<I*>(cgtp_smem);
  const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const int lane = threadIdx.x & 31;
  const bool valid = e < num_edges;
  const long long bucket = valid ? cgtp_bucket(index[e], rows) : -1;
  // The lanes of one bucket take consecutive ranks, by one atomic add of their leader.
  const unsigned peers = __match_any_sync(0xffffffffu, bucket);
  const int leader = __ffs(peers) - 1;
  I first = 0;
  if (valid && lane == leader) first = cgtp_take(state + bucket, (I)__popc(peers));
  first = __shfl_sync(0xffffffffu, first, leader);
  if (valid) rank[e] = first + (I)__popc(peers & ((1u << lane) - 1u));
  const bool descends = valid && e > 0 && cgtp_bucket(index[e - 1], rows) > bucket;
  if (__ballot_sync(0xffffffffu, descends) != 0u && lane == 0 && *descending == 0) *descending = 1;
  if (!count_blocks) return false;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) shared[32] = cgtp_take(state + rows + 3) == (I)(gridDim.x - 1);
  __syncthreads();
  const bool last = shared[32] != 0;
  if (last) __threadfence();
  return last;
}

extern "C" __global__ void __launch_bounds__(CGTP_GROUP_BLOCK) cgtp_group_count(
    const I* __restrict__ index,
    I* __restrict__ rank,
    I* __restrict__ offsets,
    I* __restrict__ state,
    const long long num_edges,
    const long long rows) {
  if (!cgtp_rank_edges(index, rank, state, num_edges, rows, true)) return;
  I* const warp_sums = reinterpret_cast<I*>(cgtp_smem);
  I carry = 0, longest = 0;
  for (long long first = 0; first <= rows; first += (long long)CGTP_SCAN_ITEMS * blockDim.x) {
    const cgtp_tile tile = cgtp_load_tile(state, first, rows);
    I total;
    const I inclusive = cgtp_block_inclusive_sum(tile.sum, warp_sums, total);
    cgtp_store_tile(tile, carry + inclusive - tile.sum, offsets, rows);
    carry += total;
    longest = tile.longest > longest ? tile.longest : longest;
  }
  longest = cgtp_block_max(longest, warp_sums);
  if (threadIdx.x == 0) offsets[rows + 1] = longest;
}

extern "C" __global__ void __launch_bounds__(CGTP_GROUP_BLOCK) cgtp_group_rank(
    const I* __restrict__ index,
    I* __restrict__ rank,
    I* __restrict__ state,
    const long long num_edges,
    const long long rows) {
  cgtp_rank_edges(index, rank, state, num_edges, rows, false);
}

// A tile's entry in `tiles`: 0 until published, then its sum with AGGREGATE, or the sum of every
// count up to its end with PREFIX.
#define CGTP_AGGREGATE (1ll << 61)
#define CGTP_PREFIX (1ll << 62)
#define CGTP_TILE_VALUE (CGTP_AGGREGATE - 1)

extern "C" __global__ void __launch_bounds__(CGTP_GROUP_BLOCK) cgtp_group_scan(
    const I* __restrict__ state,
    I* __restrict__ offsets,
    long long* __restrict__ tiles,  // zeroed: one entry per block, then the number of tiles taken, the
                                    // longest run so far and the number of blocks done
    const long long num_edges,
    const long long rows) {
  I* const shared = reinterpret_cast<I*>(cgtp_smem);  // warp sums, the tile, the sum before it
  volatile long long* const published = tiles;
  // Tiles go to blocks in the order they start, so that every tile a block waits for is running.
  if (threadIdx.x == 0) shared[32] = (I)cgtp_take(tiles + gridDim.x);
  __syncthreads();
  const long long t = shared[32];
  const cgtp_tile tile = cgtp_load_tile(state, t * CGTP_SCAN_ITEMS * blockDim.x, rows);
  I total;
  const I inclusive = cgtp_block_inclusive_sum(tile.sum, shared, total);
  if (threadIdx.x == 0) {
    I before = 0;
    if (t == 0) {
      published[0] = CGTP_PREFIX | (long long)total;
    } else {
      published[t] = CGTP_AGGREGATE | (long long)total;
      for (long long p = t - 1;; --p) {
        long long entry;
        do entry = published[p]; while (entry == 0);
        before += (I)(entry & CGTP_TILE_VALUE);
        if (entry & CGTP_PREFIX) break;
      }
      published[t] = CGTP_PREFIX | (long long)(before + total);
    }
    shared[33] = before;
  }
  __syncthreads();
  cgtp_store_tile(tile, shared[33] + inclusive - tile.sum, offsets, rows);
  const I longest = cgtp_block_max(tile.longest, shared);
  if (threadIdx.x == 0) {
    unsigned long long* const most = reinterpret_cast<unsigned long long*>(tiles + gridDim.x + 1);
    atomicMax(most, (unsigned long long)longest);
    __threadfence();
    if (cgtp_take(tiles + gridDim.x + 2) == (long long)gridDim.x - 1) {
      __threadfence();
      offsets[rows + 1] = (I)*reinterpret_cast<volatile unsigned long long*>(most);
    }
  }
}

extern "C" __global__ void __launch_bounds__(CGTP_GROUP_BLOCK) cgtp_group_place(
    const I* __restrict__ index,
    const I* __restrict__ rank,
    const I* __restrict__ offsets,
    const I* __restrict__ state,
    I* __restrict__ perm,
    const long long num_edges,
    const long long rows) {
  const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= num_edges) return;
  if (state[rows + 2] == 0) {
    perm[e] = (I)e;
    return;
  }
  const long long bucket = cgtp_bucket(index[e], rows);
  perm[(bucket == 0 ? 0 : (long long)offsets[bucket - 1]) + rank[e]] = (I)e;
}
