"""Test-wide settings: float64 enabled, so reference comparisons can ask for 1e-12; fixtures
shared by test modules."""

import contextlib
import os


def _one_gpu_per_worker():
    """Under ``PYTEST_GPU_SPREAD=N`` (``gpu_session.sh --spread``), pytest-xdist worker ``gwK`` sees
    only GPU ``K mod N``, so single-GPU tests use every GPU of the machine. Set before JAX starts."""
    gpus = int(os.environ.get("PYTEST_GPU_SPREAD", "0"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if gpus > 1 and worker.startswith("gw"):
        os.environ["CUDA_VISIBLE_DEVICES"] = str(int(worker[2:]) % gpus)


_one_gpu_per_worker()

import jax  # noqa: E402
import pytest

import jax_cgtp  # noqa: E402
from jax_cgtp.gpu import cuda_lowering  # noqa: E402

jax.config.update("jax_enable_x64", True)


# LLVM flags for XLA's CPU backend: the CPU suite's many small programs compile faster without its
# optimizations (about 0.8x the time of a test that compiles dozens); a run of the GPU tests keeps
# XLA's defaults.
FAST_CPU_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def pytest_configure(config):
    """Add FAST_CPU_COMPILE to ``XLA_FLAGS`` (before JAX starts its backends) unless the run selects
    the GPU tests (``-m gpu``)."""
    marks = config.option.markexpr
    if not ("gpu" in marks and "not gpu" not in marks):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_CPU_COMPILE}".strip()


def pytest_collection_modifyitems(items):
    """Tests marked ``slow_compile`` first (stable order otherwise): pytest-xdist hands tests out in
    collection order, so they start early on every worker instead of ending the run last."""
    items.sort(key=lambda item: item.get_closest_marker("slow_compile") is None)


@pytest.fixture
def lower_for_sm90(monkeypatch, tmp_path):
    """Lower for an H100/H200 that is not attached, with a fresh kernel cache."""
    monkeypatch.setenv("JAX_CGTP_ARCH", "sm_90")
    monkeypatch.setenv("JAX_CGTP_CACHE_DIR", str(tmp_path))
    cuda_lowering.device_arch.cache_clear()
    yield
    cuda_lowering.device_arch.cache_clear()


@pytest.fixture
def planned_with():
    """``planned_with(name=value, ...)``: the calls the test traces from then on take these settings
    (fields of :class:`jax_cgtp.Settings`; jax_cgtp caches plans and kernels per settings)."""
    with contextlib.ExitStack() as stack:
        yield lambda **settings: stack.enter_context(jax_cgtp.config(**settings))
