"""What a result was measured on: device, software versions and the repository's commit."""

from __future__ import annotations

import datetime
import os
import pathlib
import re
import subprocess
import sys

import jax
import jaxlib


def device_name() -> str:
    """The first device's kind, e.g. ``NVIDIA H100 80GB HBM3`` (``cpu`` on a CPU)."""
    device = jax.devices()[0]
    return getattr(device, "device_kind", None) or device.platform


def sanitize(name: str) -> str:
    """A folder name for ``name``: ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``.

    >>> sanitize("NVIDIA H100 80GB HBM3")
    'nvidia-h100-80gb-hbm3'
    """
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def git_commit(root=None) -> str:
    """``git rev-parse HEAD``, with ``-dirty`` when tracked files have uncommitted changes.

    ``$JAX_CGTP_GIT_COMMIT`` wins when set: a copy of the working tree without ``.git`` (as on a
    lent GPU machine) cannot ask git, so the caller passes the commit in.
    """
    if os.environ.get("JAX_CGTP_GIT_COMMIT"):
        return os.environ["JAX_CGTP_GIT_COMMIT"]
    root = root or pathlib.Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def peak_memory() -> int | None:
    """The first device's process-wide ``peak_bytes_in_use`` (None where not reported)."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:
        return None
    return None if not stats else stats.get("peak_bytes_in_use")


def describe() -> dict:
    """Device, platform, Python, jax/jaxlib versions, git commit and the time of the run."""
    device = jax.devices()[0]
    return {
        "device": device_name(),
        "platform": device.platform,
        "device_count": jax.device_count(),
        "python": sys.version.split()[0],
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "git_commit": git_commit(),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
