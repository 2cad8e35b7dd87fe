"""Bad input fails at trace time with an error naming the argument, what was expected and what was given."""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

import jax_cgtp

GOOD = ("4x0e+4x1o", "0e+1o", "4x0e+4x1o", [(0, 0, 0, "uvu", True), (1, 1, 0, "uvu", True)])


def make(irreps_in1=GOOD[0], irreps_in2=GOOD[1], irreps_out=GOOD[2], instructions=GOOD[3], **options):
    return jax_cgtp.TensorProduct(irreps_in1, irreps_in2, irreps_out, instructions, **options)


def test_malformed_irreps_names_the_argument():
    with pytest.raises(ValueError, match=r"irreps_in2: expected irreps .* got '0e\+1q'"):
        make(irreps_in2="0e+1q")


def test_instruction_index_out_of_range():
    with pytest.raises(ValueError, match=r"instructions\[1\]: index 5 is out of range for irreps_in1 .* 2 entries"):
        make(instructions=[(0, 0, 0, "uvu", True), (5, 1, 0, "uvu", True)])


def test_instruction_of_wrong_arity():
    with pytest.raises(ValueError, match=r"instructions\[0\]: expected a tuple \(i_in1, i_in2, i_out, mode, has_weight"):
        make(instructions=[(0, 0, 0, "uvu")])


def test_unknown_mode():
    with pytest.raises(ValueError, match=r"instructions\[0\]: mode must be one of .* got 'uvx'"):
        make(instructions=[(0, 0, 0, "uvx", True)])


def test_uvu_with_mismatched_multiplicities():
    with pytest.raises(ValueError, match=r"mode 'uvu' needs irreps_out\[0\] \(3x0e\) to have the multiplicity of irreps_in1\[0\] \(4x0e\), got 3 != 4"):
        make(irreps_out="3x0e", instructions=[(0, 0, 0, "uvu", True)])


def test_uuu_with_mismatched_input_multiplicities():
    with pytest.raises(ValueError, match=r"mode 'uuu' needs irreps_in2\[0\] \(2x0e\) to have the multiplicity of irreps_in1\[0\] \(4x0e\)"):
        make(irreps_in2="2x0e", irreps_out="4x0e", instructions=[(0, 0, 0, "uuu", True)])


def test_output_irrep_not_in_the_product():
    with pytest.raises(ValueError, match=r"instructions\[0\]: output irrep 1e is not in 1o x 0e \(allowed: 1o\)"):
        make(irreps_out="4x1e", instructions=[(1, 0, 0, "uvu", True)])


def test_uvw_without_weights():
    with pytest.raises(ValueError, match=r"mode 'uvw' needs has_weight=True"):
        make(instructions=[(0, 0, 0, "uvw", False)])


def test_negative_path_weight():
    with pytest.raises(ValueError, match=r"instructions\[0\]: path_weight must be >= 0, got -1.0"):
        make(instructions=[(0, 0, 0, "uvu", True, -1.0)])


def test_unknown_irrep_normalization():
    with pytest.raises(ValueError, match=r"irrep_normalization must be one of .* got 'unit'"):
        make(irrep_normalization="unit")


def test_unknown_path_normalization():
    with pytest.raises(ValueError, match=r"path_normalization must be one of .* got 'paths'"):
        make(path_normalization="paths")


def test_unknown_backend():
    with pytest.raises(ValueError, match=r"backend must be one of .* got 'triton'"):
        make(backend="triton")


def test_cuda_backend_without_gpu():
    import jax

    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match=r"backend='cuda' needs an NVIDIA GPU"):
        make(backend="cuda")


@pytest.fixture
def tp():
    return make()


def test_wrong_trailing_dimension_of_x(tp):
    with pytest.raises(ValueError, match=r"x: expected shape \(\.\.\., 16\) for irreps_in1 4x0e\+4x1o, got shape \(3, 15\)"):
        tp(jnp.ones((3, 15)), jnp.ones((3, 4)), jnp.ones(tp.weight_numel))


def test_wrong_trailing_dimension_of_y(tp):
    with pytest.raises(ValueError, match=r"y: expected shape \(\.\.\., 4\) .* got shape \(3, 3\)"):
        tp(jnp.ones((3, 16)), jnp.ones((3, 3)), jnp.ones(tp.weight_numel))


def test_wrong_weight_size(tp):
    with pytest.raises(ValueError, match=r"w: expected shape \(\.\.\., 8\) for the weights, got shape \(7,\)"):
        tp(jnp.ones((3, 16)), jnp.ones((3, 4)), jnp.ones(7))


def test_missing_weights(tp):
    with pytest.raises(ValueError, match=r"w: this tensor product needs 8 weights, got None"):
        tp(jnp.ones((3, 16)), jnp.ones((3, 4)))


def test_leading_shapes_that_do_not_broadcast(tp):
    with pytest.raises(ValueError, match=r"x, y, w: leading shapes do not broadcast"):
        tp(jnp.ones((3, 16)), jnp.ones((4, 4)), jnp.ones(tp.weight_numel))


def test_integer_operand(tp):
    with pytest.raises(TypeError, match=r"y: expected a floating-point array, got dtype int"):
        tp(jnp.ones((3, 16)), np.ones((3, 4), np.int32), jnp.ones(tp.weight_numel))


def test_mismatched_dtypes(tp):
    with pytest.raises(TypeError, match=r"operands must share one floating dtype, got x: float32, y: float64, w: float32"):
        tp(jnp.ones((3, 16), jnp.float32), jnp.ones((3, 4), jnp.float64), jnp.ones(8, jnp.float32))


def test_bad_filter_ir_out():
    with pytest.raises(ValueError, match=r"filter_ir_out: expected irreps"):
        jax_cgtp.channelwise_tensor_product("2x0e", "0e", filter_ir_out=["0e", "zz"])


def test_operands_sharded_over_an_explicit_mesh_axis():
    """Over explicit mesh axes (the types carry each array's sharding) TensorProduct and
    TensorProductConv split each call themselves (``tests/explicit_sharded.py`` on two devices);
    a primitive bound directly to such an operand says what to call instead."""
    import jax
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    from jax_cgtp.core import primitives
    from jax_cgtp.core.call import forward_call
    from jax_cgtp.core.operands import BATCHED, SHARED

    tp = make()
    x, y, w = jnp.ones((6, 16)), jnp.ones((6, 4)), jnp.ones(tp.weight_numel)
    mesh = jax.make_mesh((1,), ("data",), axis_types=(AxisType.Explicit,))
    with jax.set_mesh(mesh):
        rows = jax.device_put(x, NamedSharding(mesh, PartitionSpec("data")))
        assert jax.typeof(jax.jit(tp)(rows, y, w)).sharding.spec == PartitionSpec("data", None)
        call = forward_call(tp.problem, (BATCHED, BATCHED, SHARED, BATCHED))
        with pytest.raises(NotImplementedError, match=r"explicit mesh axes \['data'\].*TensorProduct"):
            jax.jit(lambda *a: primitives.bind(call, list(a), backend="reference"))(rows, y, w)


def test_symbolic_shapes_in_jax_export_name_the_operand():
    """Shape polymorphism (``jax.export`` with a symbolic edge count) has no kernels: the error names
    the operand and says to export concrete (padded) shapes."""
    import jax
    from jax import export

    tp = make()
    conv = jax_cgtp.TensorProductConv(*GOOD)
    (e,) = export.symbolic_shape("e")
    edges = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.float32)
    with pytest.raises(NotImplementedError, match=r"x: shape \(e, 16\) has a symbolic dimension.*concrete"):
        export.export(jax.jit(tp))(edges((e, 16)), edges((e, 4)), edges((tp.weight_numel,)))
    index = jax.ShapeDtypeStruct((e,), jnp.int32)
    with pytest.raises(NotImplementedError, match=r"y_edges: shape \(e, 4\) has a symbolic dimension"):
        export.export(jax.jit(lambda *a: conv(*a, num_nodes=3)))(
            jax.ShapeDtypeStruct((3, 16), jnp.float32), edges((e, 4)), edges((e, conv.weight_numel)), index, index)
