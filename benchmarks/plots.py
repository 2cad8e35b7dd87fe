"""Two PNGs per report: jax_cgtp's speedup bars and a roofline-style chart.

- ``speedup.png``: one panel per (peer, dtype); for each config a group of bars, one per
  phase, at ``peer ms / jax_cgtp ms`` (log scale, 1 = parity). No bar where either did not run.
- ``roofline.png``: one panel per dtype; x = arithmetic intensity (FLOP per minimum byte),
  y = achieved GFLOP/s, for every library and row; the roof is ``min(peak, intensity x copy
  bandwidth)`` with the ceilings measured in the run. Filled markers: the plain product phases;
  hollow: the convolution phases.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.ticker  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .metrics import MAIN  # noqa: E402

# filled markers: the convolution's points are drawn hollow (an unfilled marker such as "x" would vanish)
_MARKERS = {"jax_cgtp": "o", "jax_cgtp_det": "v", "e3nn": "s", "cueq": "^", "oeq": "D"}


def speedup_chart(report: dict, path) -> None:
    rows = report["rows"]
    peers = [lib for lib in report["libraries"] if lib != MAIN]
    dtypes = list(dict.fromkeys(row["dtype"] for row in rows))
    configs = list(dict.fromkeys(row["config"] for row in rows))
    phase_names = list(dict.fromkeys(row["phase"] for row in rows))
    fig, axes = plt.subplots(len(peers) or 1, len(dtypes) or 1, squeeze=False,
                             figsize=(max(6, 1.3 * len(configs)) * len(dtypes), 3.2 * max(1, len(peers))))
    width = 0.8 / max(1, len(phase_names))
    for i, peer in enumerate(peers):
        for j, dtype in enumerate(dtypes):
            ax = axes[i][j]
            for k, phase in enumerate(phase_names):
                xs, ys = [], []
                for c, config in enumerate(configs):
                    for row in rows:
                        if (row["config"], row["dtype"], row["phase"]) == (config, dtype, phase):
                            value = row.get("speedup", {}).get(peer)
                            if value:
                                xs.append(c + (k - (len(phase_names) - 1) / 2) * width)
                                ys.append(value)
                ax.bar(xs, ys, width, label=phase)
            info = report["libraries"].get(peer, {})
            if info.get("status") != "ok":
                ax.text(0.5, 0.75, f"{peer} missing: {info.get('reason', '')}"[:90], transform=ax.transAxes,
                        ha="center", va="center", fontsize=8, wrap=True)
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xticks(range(len(configs)), configs, rotation=30, ha="right", fontsize=8)
            ax.set_title(f"{MAIN} speedup over {peer}, {dtype}", fontsize=10)
            ax.set_ylabel(f"{peer} ms / {MAIN} ms")
    axes[0][0].legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def roofline_chart(report: dict, path) -> None:
    rows = report["rows"]
    dtypes = list(dict.fromkeys(row["dtype"] for row in rows))
    fig, axes = plt.subplots(1, len(dtypes) or 1, squeeze=False, figsize=(6.5 * max(1, len(dtypes)), 5))
    for j, dtype in enumerate(dtypes):
        ax = axes[0][j]
        chosen = [row for row in rows if row["dtype"] == dtype]
        ceilings = report["runs"][chosen[0].get("run", 0)]["ceilings"]
        bandwidth = ceilings["copy"]["bytes_per_s"]
        peak = ceilings["matmul"].get(dtype, {}).get("flop_per_s")
        intensities = [row["gflop"] * 1e9 / row["min_bytes"] for row in chosen]
        lo, hi = min(intensities) / 2, max(intensities) * 2
        grid = np.geomspace(lo, hi, 100)
        roof = grid * bandwidth / 1e9
        if peak:
            roof = np.minimum(roof, peak / 1e9)
        ax.plot(grid, roof, color="black", linewidth=1, label="roof (measured)")
        for n, lib in enumerate(report["libraries"]):
            color = f"C{n}"
            for conv in (False, True):
                xs, ys = [], []
                for row, intensity in zip(chosen, intensities):
                    result = row["results"].get(lib, {})
                    if (row["phase"].startswith("conv_") == conv and result.get("gflop_per_s")
                            and result.get("status") in ("ok", "mismatch")):
                        xs.append(intensity)
                        ys.append(result["gflop_per_s"])
                if xs:
                    ax.scatter(xs, ys, marker=_MARKERS.get(lib, "X"), alpha=0.75, edgecolors=color,
                               facecolors="none" if conv else color,
                               label=f"{lib} ({'conv' if conv else 'product'})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("FLOP per minimum byte")
        ax.set_ylabel("achieved GFLOP/s")
        ax.set_title(f"{dtype}: every config and phase", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
