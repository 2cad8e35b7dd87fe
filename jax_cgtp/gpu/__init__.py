"""How a ``cgtp`` call runs on an NVIDIA GPU: the planner (``schedule``), the code generators, NVRTC,
the kernel signature, the XLA FFI lowering and the edge grouping's counting sort. Imports ``core`` and
``sharding``."""
