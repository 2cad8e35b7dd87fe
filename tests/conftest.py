"""Test-wide settings: float64 enabled, so reference comparisons can ask for 1e-12."""

import jax

jax.config.update("jax_enable_x64", True)
