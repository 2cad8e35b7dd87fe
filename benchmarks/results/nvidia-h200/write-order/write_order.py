"""Does the order in which a warp writes its edge's z row cost DRAM bandwidth?

mace-l2-c128's product forward writes a 13,568-element z row per edge, one warp per edge. For each
x block and 32-channel chunk it writes each path's 32 x d elements, so the row is written in
pieces spread across the whole 54 KB row. cuEq's kernel writes it with one 768-thread block per
edge. This script times copy-like kernels (cupy, float32, 100,000 edges) with the same bytes.
Only the write order and the edge-to-thread mapping differ:

  ours        warp per edge, the generated kernel's order (x block, chunk, path);
  row         warp per edge, the row in address order;
  block-row   768-thread block per edge, the row in address order;
  ours+reads  as ours, also reading the edge's w (3,072) and x (1,152) rows, as the kernel does;
  row+reads   as row, with the same reads (w and x, in address order).

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


def _ours(reads: bool) -> str:
    lines, path = [], 0
    for xoff, dx, paths in BLOCKS:
        lines.append("for (int c = 0; c < 4; ++c) {")
        if reads:
            lines += [f"float x{k} = x[e * {X_ROW}LL + {xoff} + (c * 32 + lane) * {dx} + {k}];" for k in range(dx)]
            xs = " + ".join(f"x{k}" for k in range(dx))
        for off, d in paths:
            value = f"(w[e * {W_ROW}LL + {path * 128} + c * 32 + lane] * ({xs}))" if reads else "1.0f"
            lines.append(f"{{ const float v = {value};")
            lines.append(f"  for (int r = 0; r < {d}; ++r) z[e * {ROW}LL + {off} + c * {32 * d} + r * 32 + lane] = v + r; }}")
            path += 1
        lines.append("}")
    return "\n".join(lines)


def _row(reads: bool) -> str:
    lines = []
    if reads:
        lines.append(f"float s = 0.f; for (int i = lane; i < {W_ROW}; i += 32) s += w[e * {W_ROW}LL + i];")
        lines.append(f"for (int i = lane; i < {X_ROW}; i += 32) s += x[e * {X_ROW}LL + i];")
    value = "s" if reads else "1.0f"
    lines.append(f"for (int i = lane; i < {ROW}; i += 32) z[e * {ROW}LL + i] = {value} + i;")
    return "\n".join(lines)


def _warp_kernel(name: str, body: str) -> cp.RawKernel:
    source = f"""
extern "C" __global__ void {name}(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ z) {{
  const long long e = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
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
    cases = [
        ("ours", _warp_kernel("ours", _ours(False)), warps, write),
        ("row", _warp_kernel("row", _row(False)), warps, write),
        ("block-row", BLOCK_ROW, ((EDGES,), (768,)), write),
        ("ours+reads", _warp_kernel("ours_reads", _ours(True)), warps, write + read),
        ("row+reads", _warp_kernel("row_reads", _row(True)), warps, write + read),
    ]
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {EDGES} edges, float32")
    print(f"{'case':12s} {'ms':>8s} {'GB':>7s} {'TB/s':>6s}")
    for name, kernel, (grid, block), nbytes in cases:
        ms = _time(lambda: kernel(grid, block, (x, w, z)))
        print(f"{name:12s} {ms:8.3f} {nbytes / 1e9:7.2f} {nbytes / ms / 1e9:6.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
