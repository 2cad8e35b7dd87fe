"""``python -m benchmarks.grouping``: what ordering a convolution's edges by destination costs.

For ``E`` edges over ``E // 16`` nodes (int32), with destinations sorted (the table's graph) or
uniform at random (MACE's edge order), prints the device time of one ordering of the edges by
destination: one executable orders ``--repeats`` copies of them, each its own argument (so that XLA
cannot merge the orderings, and the host's dispatch is paid once), timed with calls queued back to
back (:mod:`benchmarks.timing`), divided by the repeats. The orderings:

* ``group_edges``: the counting sort the atomic convolution runs at each call without ``graph=``
  (:mod:`jax_cgtp.core.grouping`; on a GPU its own two kernels);
* ``sort_edges``: the stable argsort and offsets ``sort_graph`` computes once per graph (XLA).

Example: ``python -m benchmarks.grouping --edges 100000,50000,3000000``.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from jax_cgtp.core.graph import sort_edges
from jax_cgtp.core.grouping import group_edges

from .configs import RUNS, WARMUP
from .inputs import num_nodes
from .timing import compile_function, per_call_ms, time_compiled

ORDERS = ("sorted", "random")
FUNCTIONS = {"group_edges": group_edges, "sort_edges": sort_edges}


def destinations(edges: int, order: str, seed: int = 0) -> jax.Array:
    """``edges`` destinations over :func:`~benchmarks.inputs.num_nodes` nodes, sorted or not."""
    dst = np.random.default_rng(seed).integers(0, num_nodes(edges), edges, dtype=np.int32)
    return jnp.asarray(np.sort(dst) if order == "sorted" else dst)


def measure(edges: int, order: str, repeats: int, runs: int = RUNS, warmup: int = WARMUP) -> dict[str, float]:
    """Milliseconds per ordering of each of :data:`FUNCTIONS` on one set of destinations."""
    rows = num_nodes(edges)
    copies = [destinations(edges, order) for _ in range(repeats)]
    times = {}
    for name, function in FUNCTIONS.items():
        def repeated(*dsts, f=function):
            return [f(d, rows) for d in dsts]

        compiled = compile_function(repeated, copies)
        times[name] = per_call_ms(time_compiled(compiled, copies, warmup, runs)) / repeats
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edges", default="100000,50000", help="comma-separated edge counts")
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--repeats", type=int, default=20, help="orderings per executable")
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    print(f"# {getattr(device, 'device_kind', device.platform)}: microseconds per ordering, "
          f"{args.repeats} in one executable")
    print(f"{'edges':>9} {'nodes':>7} {'dst':>7} " + " ".join(f"{name:>12}" for name in FUNCTIONS))
    for edges in (int(e) for e in args.edges.split(",")):
        for order in ORDERS:
            times = measure(edges, order, args.repeats, args.runs)
            print(f"{edges:>9} {num_nodes(edges):>7} {order:>7} "
                  + " ".join(f"{1e3 * times[name]:>12.1f}" for name in FUNCTIONS))


if __name__ == "__main__":
    main()
