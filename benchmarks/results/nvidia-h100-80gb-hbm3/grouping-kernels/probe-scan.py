"""The grouping's offsets summed by the counting launch's last block, tile after tile, against
cgtp_group_scan's tiles in parallel, in one process: python3 probe.py"""
import jax
import numpy as np

from benchmarks import grouping as bench
from jax_cgtp import graph, grouping

bench.FUNCTIONS = {"group_edges": grouping.group_edges}
print(jax.devices()[0].device_kind)
parallel_tiles = grouping.scan_tiles
for mode in ("last-block", "scan-tiles"):
    grouping.scan_tiles = (lambda rows: 1) if mode == "last-block" else parallel_tiles
    jax.clear_caches()
    for edges, rows in ((100_000, None), (3_000_000, None), (3_000_000, 6250), (300_000, 2_000_000)):
        for order in ("sorted", "random"):
            rows = rows or bench.num_nodes(edges)
            bench.num_nodes = lambda e, rows=rows: rows
            dst = bench.destinations(edges, order, seed=1)
            perm, offsets = jax.jit(lambda d: grouping.group_edges(d, rows))(dst)
            _, ref = graph.sort_edges(dst, rows)
            ok = np.array_equal(offsets, ref) and np.array_equal(np.sort(np.asarray(perm)), np.arange(edges))
            ok = ok and bool(np.all(np.diff(np.asarray(dst)[np.asarray(perm)]) >= 0))
            t = bench.measure(edges, order, 20)["group_edges"]
            print(f"{mode:11s} {edges:>8} edges {rows:>8} nodes {order:7s} {1e3 * t:8.1f} us  correct={ok}", flush=True)
