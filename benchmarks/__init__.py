"""Benchmark harness: jax_cgtp side by side with its peers, against the hardware ceilings.

``python -m benchmarks.run`` times jax_cgtp, e3nn-jax, cuequivariance-jax and
OpenEquivariance's JAX extension in one process on the same random inputs, for the public
configs (:mod:`benchmarks.configs`) and the phases of :mod:`benchmarks.phases`; it reports each
library's time per call (calls queued back to back, and one blocking call; see
:mod:`benchmarks.timing`), jax_cgtp's speedup over each peer, the minimum bytes and FLOP of
the phase (:mod:`benchmarks.cost`) and the fraction of the measured memory and compute ceilings
(:mod:`benchmarks.ceilings`) that each library reaches. ``python -m benchmarks.report`` redraws
the table and plots from saved JSON files.
"""

import os

# JAX takes 75% of a GPU's memory by default; the peers' temporaries on the largest rows do not fit
# it after the rows before them (cuEq's and e3nn-jax's 7.4 GiB on nequip-revmd17-benzene's fwd, H100).
# Every benchmark process asks for 90%, as gpu_session.sh does for everything it runs, unless set.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.90")
