"""What is computed: the problem, the operands' row kinds, the call, the primitives ``cgtp`` and
``cgtp_group`` with their differentiation and batching rules, the pure-JAX reference, edge orderings
and the settings value. Imports nothing else of jax_cgtp."""
