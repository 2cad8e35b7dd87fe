// Edges grouped by an index on the GPU (a counting sort in two launches), for jax_cgtp/grouping.py.
//
// The generated code defines `I` (int or long long, the index type) before this text. Bucket 0
// holds the edges whose index is below 0, bucket n + 1 those of node n < rows, bucket rows + 1
// those at or above rows. `state` (zeroed before the first launch) holds the count of each of the
// rows + 2 buckets, then a flag set where an edge lies in a lower bucket than the edge before it,
// then the number of blocks done counting.
//
//   cgtp_group_count: each edge takes the next rank of its bucket (the lanes of a warp that share
//     a bucket take consecutive ranks by one atomic add on the bucket's count) and compares its
//     bucket with its predecessor's; the block that finishes last turns the counts into `offsets`
//     (offsets[n] = counts[0] + ... + counts[n], n <= rows, CSR over nodes).
//   cgtp_group_place: perm[start of the edge's bucket + its rank] = edge. Where no edge's bucket is
//     below its predecessor's, the edges came grouped already and perm is the identity.

extern __shared__ __align__(16) unsigned char cgtp_smem[];

#define CGTP_GROUP_BLOCK 1024
#define CGTP_SCAN_ITEMS 8

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

extern "C" __global__ void __launch_bounds__(CGTP_GROUP_BLOCK) cgtp_group_count(
    const I* __restrict__ index,
    I* __restrict__ rank,
    I* __restrict__ offsets,
    I* __restrict__ state,
    const long long num_edges,
    const long long rows) {
  volatile I* const descending = state + rows + 2;  // a flag that warps only ever set
  I* const blocks_done = state + rows + 3;
  I* const shared = reinterpret_cast<I*>(cgtp_smem);  // warp sums, then the "last block" flag
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

  // The last block to finish counting sums the counts cumulatively.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) shared[32] = cgtp_take(blocks_done) == (I)(gridDim.x - 1);
  __syncthreads();
  if (!shared[32]) return;
  __threadfence();
  I carry = 0;
  for (long long first = 0; first <= rows; first += (long long)CGTP_SCAN_ITEMS * blockDim.x) {
    const long long mine = first + (long long)CGTP_SCAN_ITEMS * threadIdx.x;
    I items[CGTP_SCAN_ITEMS];
    I sum = 0;
#pragma unroll
    for (int k = 0; k < CGTP_SCAN_ITEMS; ++k) {
      items[k] = mine + k <= rows ? __ldcg(state + mine + k) : (I)0;  // other blocks' adds: from L2
      sum += items[k];
    }
    I total;
    I running = carry + cgtp_block_inclusive_sum(sum, shared, total) - sum;
#pragma unroll
    for (int k = 0; k < CGTP_SCAN_ITEMS; ++k) {
      running += items[k];
      if (mine + k <= rows) offsets[mine + k] = running;
    }
    carry += total;
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
