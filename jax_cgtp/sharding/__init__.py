"""How a ``cgtp`` call splits across the devices its operands lie on under ``jax.jit``
(``custom_partitioning``). Imports ``core``."""
