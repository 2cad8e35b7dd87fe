"""Measure one group of rows: one config, one dtype, and the plain or the convolution phases.

For each library in order: build its product (:mod:`benchmarks.peers`), convert the shared
inputs to its layout, and for each phase compile, run once, convert the results back and check
them against the first library that ran (jax_cgtp unless it failed), then time it. A library that
is missing, cannot express the problem, fails, or disagrees is reported in the row with the
reason; nothing is dropped.
"""

from __future__ import annotations

import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from . import cost, phases
from .configs import CONFIGS
from .inputs import make_inputs
from .peers import Missing, Unsupported, adapter
from .timing import compile_function, custom_calls, memory_of, time_compiled

# Relative error ||a - b|| / ||b|| allowed between two libraries' results. float32: covers
# XLA's default TF32 matrix products (e3nn-jax's einsums) as well as plain float32 arithmetic.
TOLERANCE = {"float32": 5e-3, "float64": 1e-9}


# Below this many elements the check runs in NumPy (no XLA compilation per shape: fast on CPU).
_HOST_CHECK_SIZE = 1 << 22


@jax.jit
def _squared_norms(a, b):
    a = a.astype(jnp.promote_types(a.dtype, jnp.float32))
    b = b.astype(a.dtype)
    return jnp.sum((a - b) ** 2), jnp.sum(b**2), jnp.all(jnp.isfinite(a))


def relative_error(actual, expected) -> tuple[float, bool]:
    """``||actual - expected|| / ||expected||`` and whether ``actual`` is finite everywhere."""
    if actual.size < _HOST_CHECK_SIZE:
        a, b = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
        diff, norm, finite = np.sum((a - b) ** 2), np.sum(b**2), np.all(np.isfinite(a))
    else:
        diff, norm, finite = _squared_norms(actual, expected)
    return float(diff) ** 0.5 / max(float(norm) ** 0.5, 1e-300), bool(finite)


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip().splitlines()
    return (text[0] if text else type(error).__name__)[:300]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def new_row(tp, config: str, phase: str, dtype: str, edges: int, nodes: int) -> dict:
    """A row with its problem's two numbers and an empty result per library."""
    itemsize = jnp.dtype(dtype).itemsize
    return {
        "config": config,
        "phase": phase,
        "dtype": dtype,
        "edges": edges,
        "nodes": nodes if phases.is_conv(phase) else None,
        "problem": repr(tp.problem),
        "min_bytes": cost.min_bytes(tp.problem, phase, edges, nodes, itemsize,
                                    bool(CONFIGS[config].get("shared_weights"))),
        "gflop": cost.flop(tp.problem, phase, edges) / 1e9,
        "results": {},
    }


def _measure_phase(lib, phase, impl, lib_inputs, reference, dtype, protocol) -> dict:
    fn = phases.phase_function(phase, impl.apply)
    args = tuple(lib_inputs[name] for name in phases.input_names(phase))
    compiled = compile_function(fn, args)
    result = {"memory": memory_of(compiled), "custom_calls": custom_calls(compiled), "note": impl.note}
    outputs = compiled(*args)
    common = [impl.from_library(kind, out) for kind, out in zip(phases.output_kinds(phase), outputs)]
    del outputs
    if phase in reference:
        errors = [relative_error(out, ref) for out, ref in zip(common, reference[phase][1])]
        result["rel_err"] = max(err for err, _ in errors)
        result["checked_against"] = reference[phase][0]
        finite = all(ok for _, ok in errors)
        result["status"] = "mismatch" if finite and result["rel_err"] > TOLERANCE[dtype] else "ok"
    else:  # the first library to run is the reference of the others
        finite = all(relative_error(out, out)[1] for out in common)
        result["rel_err"] = None
        result["status"] = "ok"
        if finite:
            reference[phase] = (lib, common)
    if not finite:
        result["status"], result["error"] = "error", "non-finite result"
    del common
    result.update(time_compiled(compiled, args, protocol["warmup"], protocol["runs"]))
    return result


def _precompile_cgtp(lib, group_phases, impl, lib_inputs) -> None:
    """Compile jax_cgtp's kernels for every phase at once (NVRTC in threads), before timing."""
    if not lib.startswith("jax_cgtp") or jax.default_backend() != "gpu":
        return
    from jax_cgtp.gpu.cuda_lowering import precompile

    functions = [(phases.phase_function(p, impl.apply), phases.input_names(p)) for p in group_phases]
    precompile(lambda inputs: [fn(*(inputs[n] for n in names)) for fn, names in functions], lib_inputs)


def measure_group(tp, config, dtype, group_phases, libraries, availability, options, protocol, edges,
                  keep=None):
    """Rows of ``group_phases`` (all plain or all convolution) for every library in ``libraries``.

    ``keep(rows)``, where given, receives the rows measured so far after each library, so a run
    stopped in a slow library's phase still has every earlier library's numbers.
    """
    conv = phases.is_conv(group_phases[0])
    inputs = make_inputs(tp.problem, dtype, edges, conv, graph=options["graph"],
                         shared_weights=bool(CONFIGS[config].get("shared_weights")))
    nodes = inputs.nodes or 0
    rows = {phase: new_row(tp, config, phase, dtype, edges, nodes) for phase in group_phases}
    reference: dict = {}
    for lib in libraries:
        if availability[lib]["status"] != "ok":
            for row in rows.values():
                row["results"][lib] = {"status": "missing", "error": availability[lib]["reason"]}
            continue
        try:
            impl = adapter(lib).build(tp, jnp.dtype(dtype), conv, options)
            lib_inputs = impl.arguments(inputs)
        except (Missing, Unsupported) as error:
            status = "missing" if isinstance(error, Missing) else "unsupported"
            for row in rows.values():
                row["results"][lib] = {"status": status, "error": str(error)}
            _log(f"[{config} {dtype}] {lib}: {status}: {error}")
            continue
        except Exception as error:
            traceback.print_exc()
            for row in rows.values():
                row["results"][lib] = {"status": "error", "error": _short(error)}
            continue
        _precompile_cgtp(lib, group_phases, impl, lib_inputs)
        for phase in group_phases:
            try:
                result = _measure_phase(lib, phase, impl, lib_inputs, reference, dtype, protocol)
            except Exception as error:
                traceback.print_exc()
                result = {"status": "error", "error": _short(error)}
            rows[phase]["results"][lib] = result
            _log(f"[{config} {dtype} {phase}] {lib}: {result['status']}"
                 + (f" {result['median_ms']:.3f} ms" if "median_ms" in result else "")
                 + (f" rel_err {result['rel_err']:.1e}" if result.get("rel_err") is not None else "")
                 + (f" ({result['error']})" if result.get("error") else ""))
        del impl, lib_inputs
        if keep is not None:
            keep(_with_reference(rows, reference))
    return _with_reference(rows, reference)


def _with_reference(rows: dict, reference: dict) -> list[dict]:
    """The rows, each naming the library its results were checked against."""
    for phase, row in rows.items():
        row["reference"] = reference[phase][0] if phase in reference else None
    return list(rows.values())
