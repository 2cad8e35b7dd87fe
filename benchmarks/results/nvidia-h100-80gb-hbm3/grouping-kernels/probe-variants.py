"""Time variants of cuda/group_edges.cu in one process: python3 probe.py VARIANT.cu ..."""
import pathlib
import sys

import jax
import numpy as np

from benchmarks import grouping as bench
from jax_cgtp import graph, grouping

bench.FUNCTIONS = {"group_edges": grouping.group_edges}
print(jax.devices()[0].device_kind)
for path in sys.argv[1:]:
    text = pathlib.Path(path).read_text()
    grouping.kernel_source = lambda ctype, text=text: f"typedef {ctype} I;\n{text}"
    grouping._image.cache_clear()
    jax.clear_caches()
    for edges in (100_000, 3_000_000):
        for order in ("sorted", "random"):
            dst = bench.destinations(edges, order, seed=1)
            rows = bench.num_nodes(edges)
            perm, offsets = jax.jit(lambda d: grouping.group_edges(d, rows))(dst)
            _, ref = graph.sort_edges(dst, rows)
            ok = np.array_equal(offsets, ref) and np.array_equal(np.sort(np.asarray(perm)), np.arange(edges))
            ok = ok and np.all(np.diff(np.asarray(dst)[np.asarray(perm)]) >= 0)
            t = bench.measure(edges, order, 20)["group_edges"]
            print(f"{pathlib.Path(path).stem:16s} {edges:>8} {order:7s} {1e3 * t:8.1f} us  correct={ok}", flush=True)
