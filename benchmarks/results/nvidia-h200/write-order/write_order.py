"""Does the order in which a warp writes its edge's z row cost DRAM bandwidth?

mace-l2-c128's product forward writes a 13,568-element z row per edge, one warp per edge. For each
x block and 32-channel chunk it writes each path's 32 x d elements, so the row is written in
pieces spread across the whole 54 KB row. cuEq's kernel writes it with one 768-thread block per
edge. This script times copy-like kernels (cupy, float32, 100,000 edges) with the same bytes.
Only the write order and the edge-to-thread mapping differ:

  ours          warp per edge, the generated kernel's order (x block, chunk, path);
  ours-sorted   warp per edge, path by path in address order, each path's four chunks in turn;
  chunk-warps   four warps per edge (a 128-thread block), warp c writing chunk c of every path in
                the kernel's order, so that a path's four chunks (its whole block) are written together;
  chunk-sorted  as chunk-warps, the paths in address order;
  row           warp per edge, the row in address order, 32 elements at a time;
  block-row     768-thread block per edge, the row in address order;
  +reads        also reading the edge's w (3,072) and x (1,152) rows as the kernel does: each
                path's chunk of weights and its x block's chunk (row: w and x in address order).

Bandwidth = bytes written (+ read) / median time of 30 runs after 3 warm-ups.
"""

import statistics
import sys

import cupy as cp

EDGES = 100_000
ROW, W_ROW, X_ROW = 13568, 3072, 1152
# (x offset, x dim, [(z offset, z dim)]) of mace-l2-c128's forward, in the generated kernel's order
BLOCKS = [(0, 1, [(0, 1), (384, 3), (3072, 5), (8192, 7)]),
          (128, 3, [(768, 3), (128, 1), (2304, 3), (3712, 5), (1152, 3), (6272, 5), (9088, 7), (4352, 5),
                    (11776, 7)]),
          (512, 5, [(4992, 5), (1536, 3), (6912, 5), (9984, 7), (256, 1), (2688, 3), (5632, 5), (12672, 7),
                    (1920, 3), (7552, 5), (10880, 7)])]
CHUNKS = 4


def _paths(by_address: bool):
    """``(path, x offset, x dim, z offset, z dim)`` in the kernel's order or by z offset."""
    paths, n = [], 0
    for xoff, dx, block in BLOCKS:
        for off, d in block:
            paths.append((n, xoff, dx, off, d))
            n += 1
    return sorted(paths, key=lambda p: p[3]) if by_address else paths


def _chunk_path(path, reads: bool, chunk: str) -> list[str]:
    """One path's 32-channel chunk ``chunk``: its w (and x) chunk read, its z chunk written."""
    n, xoff, dx, off, d = path
    lines = []
    if reads:
        xs = " + ".join(f"x[e * {X_ROW}LL + {xoff} + ({chunk} * 32 + lane) * {dx} + {k}]" for k in range(dx))
        value = f"(w[e * {W_ROW}LL + {n * 128} + {chunk} * 32 + lane] * ({xs}))"
    else:
        value = "1.0f"
    lines.append(f"{{ const float v = {value};")
    lines.append(f"  for (int r = 0; r < {d}; ++r) z[e * {ROW}LL + {off} + {chunk} * {32 * d} + r * 32 + lane] = v + r; }}")
    return lines


def _ours(reads: bool, by_address: bool = False) -> str:
    """A warp per edge: by x block, chunk and path (the kernel's order), or path by path in the
    row's address order, each path's four chunks in turn."""
    lines = []
    if by_address:
        for path in _paths(True):
            lines.append("for (int c = 0; c < 4; ++c) {")
            lines += _chunk_path(path, reads, "c")
            lines.append("}")
        return "\n".join(lines)
    for xoff, _, _ in BLOCKS:
        lines.append("for (int c = 0; c < 4; ++c) {")
        for path in _paths(False):
            if path[1] == xoff:
                lines += _chunk_path(path, reads, "c")
        lines.append("}")
    return "\n".join(lines)


def _chunk_warps(reads: bool, by_address: bool) -> str:
    """Four warps per edge, warp c writing chunk c of every path (in the kernel's or the address order)."""
    lines = []
    for path in _paths(by_address):
        lines += _chunk_path(path, reads, "c")
    return "\n".join(lines)


def _row(reads: bool) -> str:
    lines = []
    if reads:
        lines.append(f"float s = 0.f; for (int i = lane; i < {W_ROW}; i += 32) s += w[e * {W_ROW}LL + i];")
        lines.append(f"for (int i = lane; i < {X_ROW}; i += 32) s += x[e * {X_ROW}LL + i];")
    value = "s" if reads else "1.0f"
    lines.append(f"for (int i = lane; i < {ROW}; i += 32) z[e * {ROW}LL + i] = {value} + i;")
    return "\n".join(lines)


def _warp_kernel(name: str, body: str, chunk_warps: bool = False) -> cp.RawKernel:
    """``body`` run by a warp per edge or, with ``chunk_warps``, by a block of four warps per edge (``c`` the warp's chunk)."""
    edge = "blockIdx.x" if chunk_warps else "((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5"
    source = f"""
extern "C" __global__ void {name}(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ z) {{
  const long long e = {edge};
  const int lane = threadIdx.x & 31;
  const int c = threadIdx.x >> 5;
  if (e >= {EDGES}) return;
  {body}
}}"""
    return cp.RawKernel(source, name)


BLOCK_ROW = cp.RawKernel(f"""
extern "C" __global__ void block_row(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ z) {{
  const long long e = blockIdx.x;
  for (int i = threadIdx.x; i < {ROW}; i += blockDim.x) z[e * {ROW}LL + i] = 1.0f + i;
}}""", "block_row")


def _time(launch, runs=30, warmups=3) -> float:
    for _ in range(warmups):
        launch()
    times = []
    for _ in range(runs):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        launch()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def main() -> None:
    x = cp.random.standard_normal((EDGES, X_ROW), dtype=cp.float32)
    w = cp.random.standard_normal((EDGES, W_ROW), dtype=cp.float32)
    z = cp.empty((EDGES, ROW), dtype=cp.float32)
    warps = ((EDGES * 32 + 127) // 128,), (128,)
    write, read = EDGES * ROW * 4, EDGES * (W_ROW + X_ROW) * 4
    per_edge = (EDGES,), (128,)
    cases = [
        ("ours", _warp_kernel("ours", _ours(False)), warps, write),
        ("ours-sorted", _warp_kernel("ours_sorted", _ours(False, True)), warps, write),
        ("chunk-warps", _warp_kernel("chunks", _chunk_warps(False, False), True), per_edge, write),
        ("chunk-sorted", _warp_kernel("chunks_sorted", _chunk_warps(False, True), True), per_edge, write),
        ("row", _warp_kernel("row", _row(False)), warps, write),
        ("block-row", BLOCK_ROW, ((EDGES,), (768,)), write),
        ("ours+reads", _warp_kernel("ours_reads", _ours(True)), warps, write + read),
        ("ours-sorted+reads", _warp_kernel("ours_sorted_reads", _ours(True, True)), warps, write + read),
        ("chunk-warps+reads", _warp_kernel("chunks_reads", _chunk_warps(True, False), True), per_edge, write + read),
        ("chunk-sorted+reads", _warp_kernel("chunks_sorted_reads", _chunk_warps(True, True), True), per_edge,
         write + read),
        ("row+reads", _warp_kernel("row_reads", _row(True)), warps, write + read),
    ]
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {EDGES} edges, float32")
    print(f"{'case':20s} {'ms':>8s} {'GB':>7s} {'TB/s':>6s}")
    for name, kernel, (grid, block), nbytes in cases:
        ms = _time(lambda: kernel(grid, block, (x, w, z)))
        print(f"{name:20s} {ms:8.3f} {nbytes / 1e9:7.2f} {nbytes / ms / 1e9:6.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
