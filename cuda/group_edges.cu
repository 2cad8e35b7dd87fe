// Edges grouped by an index (a counting sort's placement pass), for jax_cgtp/grouping.py.
//
// The generated code defines `I` (int or long long, the index type) before this text. Bucket 0
// holds the edges whose index is below 0, bucket n + 1 those of node n < rows, bucket rows + 1
// those at or above rows; `offsets[b]` (rows + 1 entries, from a count of each bucket and a
// cumulative sum) is where bucket b + 1 starts. Each edge takes the next free place of its
// bucket with an atomic add on `cursor` (zeroed before the launch), so the edges of one node
// come in no fixed order.

__device__ __forceinline__ int cgtp_take(int* cursor) { return atomicAdd(cursor, 1); }
__device__ __forceinline__ long long cgtp_take(long long* cursor) {
  return (long long)atomicAdd(reinterpret_cast<unsigned long long*>(cursor), 1ull);
}

extern "C" __global__ void __launch_bounds__(256) cgtp_group(
    const I* __restrict__ index,
    const I* __restrict__ offsets,
    I* __restrict__ perm,
    I* __restrict__ cursor,
    const long long num_edges,
    const long long rows) {
  const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= num_edges) return;
  const long long i = index[e];
  const long long bucket = i < 0 ? 0 : i < rows ? i + 1 : rows + 1;
  const long long start = bucket == 0 ? 0 : (long long)offsets[bucket - 1];
  perm[start + cgtp_take(cursor + bucket)] = (I)e;
}
