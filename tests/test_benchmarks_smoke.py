"""The benchmark harness runs end to end on the CPU (tiny sizes, reference backend), so it never rots.

One in-process smoke run (every phase, jax_cgtp and e3nn-jax; cuequivariance-jax and
OpenEquivariance are reported as missing where not installed) is shared by the tests below,
which read its report like a specification of the JSON.
"""

import json
import re
import pathlib
import sys

import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # the repository root: benchmarks/

from benchmarks import (configs, cost, edge_sharding, inputs, phases, problems, random_suite, report, run,  # noqa: E402
                        sanitize, table)
from benchmarks.peers import LIBRARIES  # noqa: E402
import jax_cgtp  # noqa: E402
from jax_cgtp.gpu import nvrtc  # noqa: E402

DEFAULTS = jax_cgtp.Settings()  # the library's settings

pytestmark = pytest.mark.slow  # runs examples and benchmarks end to end: the full suite only


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    result = run.main(["--smoke", "--configs", "tiny-uvu", "--dtype", "float64", "--out", str(out), "--tag", "smoke",
                       "--phases", ",".join(configs.ALL_PHASES)])
    return result, out


def test_smoke_run_writes_json_text_and_plots(smoke):
    _, out = smoke
    names = report.file_names("smoke")
    assert sorted(p.name for p in out.iterdir()) == sorted(names.values())
    assert "jax_cgtp ms" in (out / names["text"]).read_text()


def test_json_records_device_versions_commit_and_measured_ceilings(smoke):
    result, out = smoke
    saved = json.loads((out / report.file_names("smoke")["json"]).read_text())
    assert saved["schema"] == report.SCHEMA
    meta = saved["runs"][0]
    for key in ("device", "platform", "jax", "jaxlib", "git_commit", "protocol", "edges", "time_utc"):
        assert meta[key], key
    assert meta["smoke"] is True
    assert meta["ceilings"]["copy"]["bytes_per_s"] > 0
    assert meta["ceilings"]["matmul"]["float64"]["flop_per_s"] > 0


def test_every_library_is_listed_with_a_version_or_the_reason_it_is_missing(smoke):
    result, _ = smoke
    assert list(result["libraries"]) == list(LIBRARIES)
    for info in result["libraries"].values():
        assert (info["status"], bool(info.get("version"))) == ("ok", True) or (
            info["status"] == "missing" and info["reason"]
        )
    assert result["libraries"]["jax_cgtp"]["status"] == "ok"
    assert result["libraries"]["e3nn"]["status"] == "ok"


def test_one_row_per_phase_with_cost_numbers_and_every_library(smoke):
    result, _ = smoke
    rows = result["rows"]
    assert [row["phase"] for row in rows] == list(phases.OUTPUT_KINDS) + [f"conv_{p}" for p in phases.OUTPUT_KINDS]
    for row in rows:
        assert row["min_bytes"] > 0 and row["gflop"] > 0
        assert row["memory_floor_ms"] > 0 and row["compute_floor_ms"] > 0
        assert set(row["results"]) == set(LIBRARIES)
        assert (row["nodes"] is not None) == row["phase"].startswith("conv_")


def test_jax_cgtp_and_e3nn_agree_and_are_timed(smoke):
    result, _ = smoke
    for row in result["rows"]:
        ours, theirs = row["results"]["jax_cgtp"], row["results"]["e3nn"]
        assert row["reference"] == "jax_cgtp"
        assert ours["status"] == "ok" and ours["median_ms"] > 0 and ours["runs"] >= 3
        assert theirs["status"] == "ok" and theirs["rel_err"] < 1e-9
        assert row["speedup"]["e3nn"] == pytest.approx(theirs["pipelined_ms"] / ours["pipelined_ms"])
        assert row["sync_speedup"]["e3nn"] == pytest.approx(theirs["median_ms"] / ours["median_ms"])
        assert 0 < ours["floor_fraction"] and ours["memory"]["total"] > 0


def test_unavailable_peers_are_reported_not_dropped(smoke):
    result, _ = smoke
    for row in result["rows"]:
        for lib in ("cueq", "oeq"):
            status = row["results"][lib]["status"]
            assert status in ("ok", "missing", "unsupported")
            if status != "ok":
                assert row["results"][lib]["error"]
                assert row["speedup"][lib] is None


def test_merging_two_reports_keeps_every_row_and_run(smoke, tmp_path):
    result, _ = smoke
    merged = report.merge([result, result])
    assert len(merged["runs"]) == 2 and len(merged["rows"]) == 2 * len(result["rows"])
    assert {row["run"] for row in merged["rows"]} == {0, 1}
    assert "bench.json" in report.write(merged, tmp_path, with_plots=False)["json"]


def test_merged_table_lists_as_not_measured_only_phases_that_no_row_has(smoke):
    result, _ = smoke
    row = result["rows"][0]
    cut_short = {**result, "runs": [{**result["runs"][0], "skipped": [f"{row['config']} {row['dtype']} {row['phase']},bogus"]}],
                 "rows": []}
    text = table.render(report.merge([cut_short, result]))
    assert text.count("not measured") == 1
    assert f"not measured (time budget of the run spent): {row['config']} {row['dtype']} bogus" in text


def test_compare_gives_each_later_report_over_the_base_row_by_row(smoke, tmp_path, capsys):
    """A report twice as slow on one row reads 2.000 there and 1.000 elsewhere; rows the other
    report lacks are left out; a file that is not a report is an error naming it."""
    import copy

    from benchmarks import compare

    result, _ = smoke
    slower = copy.deepcopy(result)
    first = slower["rows"][0]
    lib = next(name for name, r in first["results"].items() if r.get("status") == "ok")
    for key in ("pipelined_ms", "median_ms"):
        if first["results"][lib].get(key):
            first["results"][lib][key] *= 2
    del slower["rows"][-1]
    report.write(result, tmp_path / "a", with_plots=False)
    report.write(slower, tmp_path / "b", with_plots=False)
    text = compare.main([str(tmp_path / "a" / "bench.json"), str(tmp_path / "b" / "bench.json"), "--names", "a,b"])
    lines = text.splitlines()[2:]
    measured = sum(r.get("status") == "ok" for row in slower["rows"] for r in row["results"].values())
    assert len(lines) == measured
    ratios = {tuple(line.split()[:4]): float(line.split()[-1]) for line in lines}
    assert ratios.pop((first["config"], first["phase"], first["dtype"], lib)) == 2.0
    assert set(ratios.values()) == {1.0}
    (tmp_path / "not.json").write_text("{}")
    with pytest.raises(SystemExit):
        compare.main([str(tmp_path / "a" / "bench.json"), str(tmp_path / "not.json")])
    assert "not.json is not a" in capsys.readouterr().err


def test_min_bytes_of_the_backward_reads_four_operands_and_writes_three():
    from benchmarks.problems import build

    p = build("tiny-uvw", backend="reference").problem
    d1, d2, dw, d3 = p.irreps_in1.dim, p.irreps_in2.dim, p.weight_numel, p.irreps_out.dim
    assert cost.min_bytes(p, "bwd", edges=5, nodes=1, itemsize=8) == 5 * 8 * (2 * d1 + 2 * d2 + 2 * dw + d3)
    assert cost.min_bytes(p, "conv_fwd", edges=5, nodes=2, itemsize=8) == 8 * (2 * d1 + 5 * (d2 + dw) + 2 * d3) + 5 * 2 * 4


def test_profile_counts_the_launches_that_jit_keeps(lower_for_sm90, capsys):
    """The launches of a phase, as ``jax.jit`` runs it: a backward's unused forward is dropped (on a
    graph of a few nodes the forward adds its tiles atomically; where it walks destination runs it
    is two launches: each run's first edges, then the rest)."""
    from benchmarks import profile

    counts = {}
    for phase, settings in (("conv_fwd", ""), ("conv_fwd", "owned_forward_min_nodes=(('float', 0),)"),
                            ("conv_bwd", ""), ("conv_dbwd", "")):
        profile.main(["tiny-uvu", phase, "float32", "--edges", "64", "--launches", "--set", settings])
        counts[phase, bool(settings)] = int(capsys.readouterr().out)
    assert counts == {("conv_fwd", False): 1, ("conv_fwd", True): 2, ("conv_bwd", False): 1, ("conv_dbwd", False): 2}


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed on this machine")
@pytest.mark.slow_compile
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nvrtc_compiles_the_product_kernels_of_every_public_config(lower_for_sm90, dtype):
    """Every public benchmark config's forward and fused backward, as the benchmark plans them (its
    edge count for the dtype): NVRTC compiles each kernel to a cubin with 1-255 registers and no
    local memory beyond a few spilled words."""
    from concurrent.futures import ThreadPoolExecutor

    from benchmarks import kernel_stats
    from jax_cgtp.gpu import cuda_lowering

    kernels = {(config, phase): kernel_stats.row_kernels(config, phase, dtype, "jax_cgtp")
               for config in configs.SUITES["public"] for phase in ("fwd", "bwd")}
    assert all(len(planned) == 1 for planned in kernels.values()), {row: len(k) for row, k in kernels.items()}

    def compiled(kernel):
        return kernel_stats.cubin_stats(cuda_lowering.kernel_cubin(kernel, "sm_90"))

    with ThreadPoolExecutor() as pool:
        stats = dict(zip(kernels, pool.map(compiled, (planned[0] for planned in kernels.values()))))
    for row, s in stats.items():
        assert 0 < s.registers <= 255 and s.instructions > 0 and s.local_bytes <= 256, (row, s)


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed on this machine")
def test_kernel_stats_reads_registers_and_code_size_from_each_cubin(lower_for_sm90, capsys):
    """One line per launch of each row (a double backward is two, the atomic forward by destination
    runs too, the deterministic one three: its runs' first chunks, the later chunks, their sums), each
    kernel with 1-255 registers and some SASS; a file that is not a cubin and an unknown variant are
    errors."""
    from benchmarks import kernel_stats

    kernel_stats.main(["--configs", "tiny-uvu", "--phases", "conv_fwd,dbwd", "--dtype", "float32"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[1], r[3], r[4]) for r in rows] == [
        ("conv_fwd", "jax_cgtp", "0"), ("conv_fwd", "jax_cgtp", "1"), ("conv_fwd", "jax_cgtp_det", "0"),
        ("conv_fwd", "jax_cgtp_det", "1"), ("conv_fwd", "jax_cgtp_det", "2"), ("dbwd", "jax_cgtp", "0"),
        ("dbwd", "jax_cgtp", "1")]
    assert all(0 < int(r[5]) <= 255 and int(r[6]) > 0 and int(r[7]) >= 0 for r in rows)
    with pytest.raises(ValueError, match="not an ELF64 cubin"):
        kernel_stats.cubin_stats(b"not a cubin")
    local = ('extern "C" __global__ void cgtp_kernel(float* p, int i) '
             "{ float a[1024]; for (int j = 0; j < 1024; ++j) a[j] = p[j]; a[i & 1023] += 1.0f; "
             "for (int j = 0; j < 1024; ++j) p[j] = a[j] * a[1023 - j]; }")
    assert kernel_stats.cubin_stats(nvrtc.compile_cubin(local, "sm_90")).local_bytes >= 4096  # the array
    with pytest.raises(ValueError, match="no section .text.other"):
        kernel_stats.cubin_stats(nvrtc.compile_cubin(local, "sm_90"), "other")
    with pytest.raises(SystemExit):
        kernel_stats.main(["--configs", "tiny-uvu", "--libs", "cueq"])
    assert "unknown lib cueq" in capsys.readouterr().err


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed on this machine")
def test_kernel_stats_plans_under_the_settings_it_is_given(lower_for_sm90, capsys):
    """``--set`` applies settings while the kernels are planned: with z apart from x̄, ȳ and w̄ at any
    size, the convolution's force-loss second derivative is one launch more."""
    from benchmarks import kernel_stats

    launches = []
    for settings in ("", "z_with_backward_max_terms=0"):
        kernel_stats.main(["--configs", "tiny-uvu", "--phases", "conv_train", "--dtype", "float32", "--libs", "jax_cgtp",
                           "--set", settings])
        launches.append(len(capsys.readouterr().out.splitlines()) - 1)
    assert launches[1] == launches[0] + 1


def test_profile_runs_the_phase_on_the_graph_it_is_given(monkeypatch):
    """``--graph`` picks the convolution's graph (here the spatial one, whose ``dst`` is sorted and
    whose sources lie near their destination), and an unknown graph is refused."""
    from benchmarks import inputs, profile

    graphs = []

    def recording(*args, graph="random", **kwargs):
        graphs.append(graph)
        return inputs.make_inputs(*args, graph=graph, **kwargs)

    monkeypatch.setattr(profile, "make_inputs", recording)
    profile.main(["tiny-uvu", "conv_bwd", "float32", "--edges", "1024", "--graph", "spatial", "--warmup", "0"])
    assert graphs == ["spatial"]
    with pytest.raises(SystemExit):
        profile.main(["tiny-uvu", "conv_bwd", "float32", "--graph", "ring"])


def test_profile_plans_under_the_settings_it_is_given(lower_for_sm90, capsys, planned_with):
    """``--set`` applies settings while the phase is traced (here: the look-ahead ring of the
    deterministic forward, a walk over destination runs, off), and refuses a setting that does not
    exist."""
    from benchmarks import profile

    planned_with(owned_forward_min_nodes=(("float", 0), ("double", 0)))  # the atomic forward walks the runs too
    profile.main(["tiny-uvu", "conv_fwd", "float32", "--edges", "64", "--launches"])
    walk = capsys.readouterr().err.splitlines()[0]
    assert walk.startswith("launch 0:") and "look-ahead ring of 4 slots, each run's first 128 edges" in walk
    profile.main(["tiny-uvu", "conv_fwd", "float32", "--edges", "64", "--launches", "--set", "owned_ahead_depth=0"])
    walk = capsys.readouterr().err.splitlines()[0]
    assert walk.startswith("launch 0:") and "look-ahead ring" not in walk
    assert jax_cgtp.core.settings.active().owned_ahead_depth == DEFAULTS.owned_ahead_depth  # for that command alone
    with pytest.raises(SystemExit):
        profile.main(["tiny-uvu", "conv_fwd", "float32", "--launches", "--set", "ahead_dept=0"])
    assert "'ahead_dept' is not a setting" in capsys.readouterr().err


def test_run_applies_and_records_the_settings_it_is_given(tmp_path, monkeypatch):
    """``benchmarks.run --set`` runs under the settings, records them in the report, leaves them
    behind when it returns, and refuses a setting that does not exist."""
    seen = []
    measure_group = run.measure.measure_group

    def recording(*args, **kwargs):
        seen.append(jax_cgtp.core.settings.active().owned_ahead_depth)
        return measure_group(*args, **kwargs)

    monkeypatch.setattr(run.measure, "measure_group", recording)
    result = run.main(["--smoke", "--configs", "tiny-uvu", "--dtype", "float32", "--phases", "conv_fwd", "--libs",
                       "jax_cgtp", "--out", str(tmp_path), "--no-plots", "--set", "owned_ahead_depth=1"])
    assert seen == [1] and jax_cgtp.core.settings.active().owned_ahead_depth == DEFAULTS.owned_ahead_depth
    assert result["runs"][0]["settings"] == "owned_ahead_depth=1"
    assert "settings owned_ahead_depth=1" in next(tmp_path.glob("bench*.txt")).read_text()
    with pytest.raises(SystemExit):
        run.parse_args(["--set", "owned_ahead_dept=1"])


def test_rows_measure_exactly_the_rows_named_in_their_order(tmp_path, capsys):
    """``--rows`` measures the named rows alone, grouped by config and dtype (the product's phases
    and the convolution's apart), and refuses malformed rows or a mix with the cross-product options."""
    named = ["tiny-uvw:conv_fwd:float64", "tiny-uvu:bwd:float32", "tiny-uvw:fwd:float64", "tiny-uvu:fwd:float32"]
    args = run.parse_args(["--rows", ",".join(named)])
    assert run.measured_groups(args) == [("tiny-uvw", "float64", ["conv_fwd"]), ("tiny-uvu", "float32", ["bwd", "fwd"]),
                                         ("tiny-uvw", "float64", ["fwd"])]
    assert (args.configs, args.phases, args.dtype) == (["tiny-uvw", "tiny-uvu"], ["conv_fwd", "bwd", "fwd"],
                                                       ["float64", "float32"])
    result = run.main(["--smoke", "--rows", ",".join(named[:2]), "--libs", "jax_cgtp", "--out", str(tmp_path),
                       "--no-plots"])
    assert [(r["config"], r["phase"], r["dtype"]) for r in result["rows"]] == [("tiny-uvw", "conv_fwd", "float64"),
                                                                             ("tiny-uvu", "bwd", "float32")]
    everything = run.parse_args(["--configs", "tiny-uvu", "--dtype", "float32", "--phases", "conv_fwd,fwd"])
    assert run.measured_groups(everything) == [("tiny-uvu", "float32", ["conv_fwd"]), ("tiny-uvu", "float32", ["fwd"])]
    for bad, message in ((["--rows", "tiny-uvu:fwd"], "expected config:phase:dtype"),
                         (["--rows", "tiny-uvu:fwd:float32", "--dtype", "float64"], "drop --dtype"),
                         (["--rows", "tiny-uvu:fwd:float16"], "unknown dtype 'float16' in tiny-uvu:fwd:float16"),
                         (["--rows", "nope:fwd:float32"], "unknown config 'nope'")):
        with pytest.raises(SystemExit):
            run.parse_args(bad)
        assert message in capsys.readouterr().err


def test_processes_sharing_claims_measure_each_group_once(tmp_path):
    """Runs given one ``--claims`` folder split the groups, the most work first: the second measures
    only those the first left, together they hold every row once, and a run whose time is spent
    lists as skipped only the groups that no run claimed."""
    named = "tiny-uvu:fwd:float32,tiny-uvu:conv_fwd:float32,tiny-uvw:fwd:float64"
    common = ["--smoke", "--rows", named, "--libs", "jax_cgtp", "--out", str(tmp_path), "--no-plots",
              "--claims", str(tmp_path / "claims")]
    assert run.claim(tmp_path / "claims", "tiny-uvu", "float32", ["conv_fwd"])
    first = run.main(common + ["--tag", "a"])
    second = run.main(common + ["--tag", "b"])
    assert [(r["config"], r["phase"]) for r in first["rows"]] == [("tiny-uvu", "fwd"), ("tiny-uvw", "fwd")]
    assert second["rows"] == [] and second["runs"][0]["skipped"] == []
    assert not run.claim(tmp_path / "claims", "tiny-uvw", "float64", ["fwd"])
    groups = run.measured_groups(run.parse_args(["--rows", named]))
    products = {config: problems.build(config) for config in ("tiny-uvu", "tiny-uvw")}
    by_work = run.longest_first(groups, products, {"float32": 100, "float64": 100})
    assert sorted(by_work) == sorted(groups)
    work = [sum(cost.flop(products[c].problem, p, 100) for p in phases) for c, _, phases in by_work]
    assert work == sorted(work, reverse=True) and work[0] > work[-1]
    spent = run.main(["--smoke", "--rows", named + ",tiny-uvw:bwd:float32", "--libs", "jax_cgtp", "--out",
                      str(tmp_path), "--no-plots", "--claims", str(tmp_path / "claims"), "--time-budget", "-1"])
    assert spent["rows"] == [] and spent["runs"][0]["skipped"] == ["tiny-uvw float32 bwd"]  # the others are claimed


def test_ab_times_each_variant_of_a_setting_on_the_same_row(tmp_path):
    from benchmarks import ab

    rows = ab.main(["--configs", "tiny-uvu", "--phases", "conv_fwd", "--edges", "64", "--rounds", "2", "--calls", "2",
                    "--variant", "base:", "--variant", "plain:walk_tile=8"])
    rows += ab.main(["--configs", "tiny-uvu", "--phases", "conv_bwd", "--edges", "1600", "--graph", "spatial",
                     "--shared-weights", "--rounds", "1", "--calls", "2", "--variant", "base:"])
    rows += ab.main(["--rows", "tiny-uvw:fwd:float64,tiny-uvu:bwd:float32", "--edges", "64", "--rounds", "1",
                     "--calls", "2", "--variant", "base:"])
    row, spatial, *named = rows
    assert [(r["config"], r["phase"], r["dtype"]) for r in named] == [("tiny-uvw", "fwd", "float64"),
                                                                    ("tiny-uvu", "bwd", "float32")]
    assert row["edges"] == 64 and [len(row["ms"][n]) for n in ("base", "plain")] == [2, 2]
    assert all(ms > 0 for times in row["ms"].values() for ms in times)
    assert (row["graph"], spatial["graph"], spatial["edges"]) == ("random", "spatial", 1600)
    assert (row["shared_weights"], spatial["shared_weights"]) == (False, True)
    saved = tmp_path / "ab.json"
    with pytest.raises(ValueError, match="spatial graph"):  # 64 edges: 4 nodes, too few for 16 neighbours each
        ab.main(["--configs", "tiny-uvu", "--phases", "fwd,conv_fwd", "--edges", "64", "--graph", "spatial",
                 "--rounds", "1", "--calls", "2", "--variant", "b:", "--json", str(saved)])
    kept = json.loads(saved.read_text())  # written after each row: the row measured before the error
    assert [(r["phase"], len(r["ms"]["b"])) for r in kept["rows"]] == [("fwd", 1)] and kept["variants"] == ["b:"]
    assert kept["run"]["git_commit"] and kept["run"]["device"]
    assert ab.parse_variant("x:walk_tile=8; lockstep_warps=((800, 4),)") == (
        "x", {"walk_tile": 8, "lockstep_warps": ((800, 4),)})
    for bad in ("nameless", ":walk_tile=8", "x:WALK_TILE=8", "x:not_there=1", "x:walk_tile"):
        with pytest.raises(SystemExit):
            ab.main(["--configs", "tiny-uvu", "--phases", "fwd", "--variant", bad])
    for rows in (["--configs", "tiny-uvu"], ["--rows", "tiny-uvu:fwd:float32", "--phases", "fwd"]):
        with pytest.raises(SystemExit):
            ab.main(rows + ["--variant", "b:"])


def test_double_backward_rows_against_their_two_call_floor(smoke, capsys):
    """The double backward's floor as two calls: x, w, g (and the convolution's indices) read
    twice, ȳ written, doubled by XLA and read again; each library's fraction of it."""
    from benchmarks.problems import build

    result, out = smoke
    fractions = {(r["phase"], r["dtype"]): r for r in cost.two_call_fractions(result)}
    assert sorted(fractions) == [("conv_dbwd", "float64"), ("dbwd", "float64")]
    for row in result["rows"]:
        if (row["phase"], row["dtype"]) in fractions:
            r = fractions[row["phase"], row["dtype"]]
            assert r["two_call_floor_ms"] == pytest.approx(row["memory_floor_ms"] * r["scale"]) and r["scale"] > 1
            ms = row["results"]["jax_cgtp"]["pipelined_ms"]
            assert r["fraction"]["jax_cgtp"] == pytest.approx(r["two_call_floor_ms"] / ms)
    tp = build("tiny-uvu", backend="reference")
    d1, d2, dw, d3 = (tp.problem.irreps_in1.dim, tp.problem.irreps_in2.dim, tp.problem.weight_numel,
                      tp.problem.irreps_out.dim)
    assert cost.two_call_bytes(tp.problem, "conv_dbwd", edges=5, nodes=2, itemsize=8) == (
        8 * (2 * (3 * d1 + 2 * d3) + 5 * (3 * dw + 4 * d2)) + 4 * 4 * 5)
    with pytest.raises(ValueError, match="one call"):
        cost.two_call_bytes(tp.problem, "bwd", edges=5, nodes=2, itemsize=8)
    cost.main([str(out / report.file_names("smoke")["json"])])
    assert "tiny-uvu" in capsys.readouterr().out
    _assert_rejected(cost.main, out.parent / "not-a-report.json", "{}", "is not a", capsys)
    renamed = json.loads((out / report.file_names("smoke")["json"]).read_text())
    for row in renamed["rows"]:
        row["config"] = "no-such-config"
    _assert_rejected(cost.main, out.parent / "renamed.json", json.dumps(renamed),
                     "'no-such-config' is not one of benchmarks.configs.CONFIGS", capsys)


def _assert_rejected(main, path, text: str, message: str, capsys) -> None:
    """``main([path])`` with ``text`` written at ``path`` exits with ``message`` on stderr."""
    path.write_text(text)
    with pytest.raises(SystemExit):
        main([str(path)])
    assert message in capsys.readouterr().err


def test_a_sources_file_rebuilds_a_table_row_by_row(smoke, tmp_path):
    _, out = smoke
    saved = json.loads((out / report.file_names("smoke")["json"]).read_text())
    commit = saved["runs"][0]["git_commit"]
    first, second = saved["rows"][:2]
    first["results"]["jax_cgtp_det"] = first["results"]["jax_cgtp"]  # as a run with the deterministic variant has
    path = tmp_path / "with-det.json"
    path.write_text(json.dumps(saved))
    sources = tmp_path / "sources.txt"
    sources.write_text(f"# a comment\n{second['config']} {second['phase']} {second['dtype']} {commit} {path}\n\n"
                       f"{first['config']} {first['phase']} {first['dtype']} {commit} {path} without-det\n")
    table = report.main(["--sources", str(sources), "--out", str(tmp_path), "--tag", "picked"])
    assert [(r["phase"], r["run"]) for r in table["rows"]] == [(second["phase"], 0), (first["phase"], 0)]
    assert len(table["runs"]) == 1 and table["rows"][0]["results"] == second["results"]
    assert "jax_cgtp_det" not in table["rows"][1]["results"]
    sources.write_text(sources.read_text().replace(" without-det", ""))
    assert "jax_cgtp_det" in report.select(sources)["rows"][1]["results"]
    for line, message in ((f"{first['config']} {first['phase']} {first['dtype']} deadbee {path}", "measured at"),
                          (f"{first['config']} nophase {first['dtype']} {commit} {path}", "has 0 rows"),
                          (f"{first['config']} {first['phase']} {first['dtype']} {commit}", "expected 'config")):
        sources.write_text(line + "\n")
        with pytest.raises(ValueError, match=message):
            report.select(sources)


def test_spatial_graph_connects_each_node_to_nearby_lattice_points():
    side, per_node = 6, 6
    src, dst = inputs.spatial_graph(side**3, side**3 * per_node, seed=1)
    assert np.array_equal(dst, np.repeat(np.arange(side**3), per_node)) and not np.any(src == dst)
    offsets = np.abs(np.subtract(np.unravel_index(src, (side,) * 3), np.unravel_index(dst, (side,) * 3)))
    assert offsets.max() <= 2  # uniform sources would reach across the lattice
    for nodes, edges in ((216, 1000), (4, 64), (0, 0)):
        with pytest.raises(ValueError, match="spatial graph"):
            inputs.spatial_graph(nodes, edges)
    with pytest.raises(ValueError, match="graph 'ring'"):
        inputs.make_inputs(None, "float64", 16, True, graph="ring")


def test_dense_graph_gives_each_node_32_to_96_nearby_sources():
    side = 9
    src, dst = inputs.dense_graph(side**3, side**3 * 64, seed=2)
    counts = np.bincount(dst, minlength=side**3)
    assert len(src) == side**3 * 64 and np.all(np.diff(dst) >= 0) and not np.any(src == dst)
    assert counts.min() >= 32 and counts.max() <= 96 and 0.3 < np.mean(counts > 64) < 0.7
    for node in (0, 364):  # each node's sources are distinct
        sources = src[dst == node]
        assert len(set(sources)) == len(sources)
    offsets = np.abs(np.subtract(np.unravel_index(src, (side,) * 3), np.unravel_index(dst, (side,) * 3)))
    assert offsets.max() <= 5  # a corner's nearest 96 too; uniform sources would reach across the lattice
    for nodes, edges in ((96, 96 * 64), (343, 343 * 20), (343, 343 * 100)):
        with pytest.raises(ValueError, match="dense graph"):
            inputs.dense_graph(nodes, edges)
    problem = problems.conv_of(problems.build("tiny-uvu")).problem
    dense = inputs.make_inputs(problem, "float32", 400 * 64, True, graph="dense")
    assert dense.nodes == 400 and dense.src.shape == (400 * 64,)


def test_the_padded_graph_joins_its_last_eighth_of_edges_to_the_last_node():
    problem = problems.conv_of(problems.build("tiny-uvu")).problem
    random, padded = (inputs.make_inputs(problem, "float64", 1600, True, graph=g) for g in ("random", "padded"))
    src, dst = np.asarray(padded.src), np.asarray(padded.dst)
    assert (src[1400:] == 99).all() and (dst[1400:] == 99).all() and (np.diff(dst) >= 0).all()
    np.testing.assert_array_equal(src[:1400], np.asarray(random.src)[:1400])
    np.testing.assert_array_equal(dst[:1400], np.asarray(random.dst)[:1400])


def test_the_by_source_graph_groups_the_random_graphs_edges_by_sender():
    problem = jax_cgtp.channelwise_tensor_product("2x0e", "0e").problem
    random, by_source = (inputs.make_inputs(problem, "float64", 64, True, graph=g) for g in ("random", "by_source"))
    assert np.array_equal(by_source.src, random.dst) and np.array_equal(by_source.dst, random.src)
    assert np.all(np.diff(np.asarray(by_source.src)) >= 0) and np.any(np.diff(np.asarray(by_source.dst)) < 0)


def test_a_run_on_the_spatial_graph_records_it(tmp_path):
    result = run.main(["--smoke", "--configs", "tiny-uvu", "--dtype", "float64", "--edges-float64", "1600", "--graph",
                       "spatial", "--phases", "conv_fwd", "--libs", "jax_cgtp,e3nn,jax_cgtp_graph", "--out", str(tmp_path)])
    assert result["runs"][0]["graph"] == "spatial"
    (row,) = result["rows"]
    assert (row["edges"], row["nodes"]) == (1600, 100)
    for lib in ("e3nn", "jax_cgtp_graph"):
        assert row["results"][lib]["status"] == "ok" and row["results"][lib]["rel_err"] < 1e-12
    assert "spatial graph" in (tmp_path / report.file_names(None)["text"]).read_text()


def _target_row(smoke_row: dict, phase: str, floor_ms: float, memory=None, dtype=None, **times) -> dict:
    """A copy of a smoke run's row of ``phase`` with the given floor, per-call times (ms) and, per
    library in ``memory``, its buffers' ``(arguments and outputs, temporaries)`` in bytes."""
    row = json.loads(json.dumps(smoke_row))
    row["memory_floor_ms"] = floor_ms
    row["dtype"] = dtype or row["dtype"]
    row["results"] = {lib: {"status": "ok", "pipelined_ms": ms} for lib, ms in times.items()}
    for lib, (held, temp) in (memory or {}).items():
        row["results"][lib]["memory"] = {"argument": held - 100, "output": 100, "temp": temp, "alias": 0,
                                         "total": held + temp}
    return row


def test_targets_class_each_miss_by_the_floor_it_asks_for(smoke, capsys):
    """A missed target is beyond the floor when its bound is shorter than the row's floor (the
    two-call floor for a double backward), else within it; each row is judged on the first report
    that has the libraries the target compares. The deterministic variant's verdict gives what its
    extra temporaries alone cost, written and read once at the floor's bandwidth."""
    from benchmarks import targets

    result, out = smoke
    rows = {row["phase"]: row for row in result["rows"]}
    workspace = rows["conv_bwd"]["min_bytes"] // 4  # 0.25 ms of traffic at the 0.5 ms floor's bandwidth
    first = {"schema": report.SCHEMA, "runs": [], "libraries": {}, "rows": [
        _target_row(rows["conv_bwd"], "conv_bwd", 0.5, jax_cgtp=1.0, cueq=1.8, jax_cgtp_det=1.2,
                    memory={"jax_cgtp": (400, 7), "jax_cgtp_det": (400, 7 + workspace)}),
        _target_row(rows["bwd"], "bwd", 0.95, jax_cgtp=1.0, cueq=1.4),
        _target_row(rows["fwd"], "fwd", 0.5, jax_cgtp=1.0, cueq=1.1),
        _target_row(rows["dbwd"], "dbwd", 0.5, jax_cgtp=1.0, cueq=1.2),
    ]}
    second = {"schema": report.SCHEMA, "runs": [], "libraries": {}, "rows": [
        _target_row(rows["conv_bwd"], "conv_bwd", 0.5, jax_cgtp=1.0, cueq=9.0, oeq=0.9, e3nn=20.0,
                    memory={"jax_cgtp": (400, 0), "e3nn": (400, 700)}),
        _target_row(rows["conv_bwd"], "conv_bwd", 0.5, dtype="float32", jax_cgtp=1.0, e3nn=20.0,
                    memory={"jax_cgtp": (400, 0), "e3nn": (400, 900)}),
    ]}
    verdicts = {t.name: v for t, v in targets.evaluate([first, second]).items()}
    (conv_bwd,) = verdicts["conv_bwd >= 2x cuEq"]
    assert conv_bwd["verdict"] == targets.WITHIN and conv_bwd["bound"] == pytest.approx(0.9)
    assert conv_bwd["needs"] == pytest.approx(0.5 / 0.9)
    (bwd,) = verdicts["bwd >= 1.5x cuEq"]
    assert bwd["verdict"] == targets.BEYOND  # 1.4 / 1.5 ms is shorter than the 0.95 ms floor
    assert [v["verdict"] for v in verdicts["fwd >= 1.0x the best of cuEq and OEQ"]] == [targets.MET]
    (dbwd,) = verdicts["dbwd >= 1.5x cuEq"]
    assert dbwd["floor"] == pytest.approx(0.5 * cost.two_call_scale(first["rows"][3])) and dbwd["floor"] > 0.8
    assert dbwd["verdict"] == targets.BEYOND  # 0.8 ms is below the two-call floor, not below the one-pass one
    (det,) = verdicts["deterministic within 1.3x of atomic"]
    assert det["verdict"] == targets.MET and det["subject"] == "jax_cgtp_det"
    assert det["workspace"] == (workspace, pytest.approx(1.25, rel=1e-6))
    (oeq,) = verdicts["every conv phase >= 1.0x OEQ"]  # from the second report, the first lacks OEQ
    assert oeq["verdict"] == targets.WITHIN and oeq["bound"] == pytest.approx(0.9)
    assert verdicts["every phase >= 4x e3nn-jax"] == []
    beyond, met = verdicts["conv forward+backward memory <= 1/3 of e3nn-jax's"]
    assert beyond["verdict"] == targets.BEYOND  # a third of 1,100 bytes is less than the 400 every library holds
    assert beyond["needs"] == pytest.approx(400 / (1100 / 3)) and met["verdict"] == targets.MET
    targets.main([str(out / report.file_names("smoke")["json"])])
    assert "issue 5: every conv phase >= 10x e3nn-jax" in capsys.readouterr().out
    _assert_rejected(targets.main, out.parent / "a-list.json", "[]", "is not a", capsys)


def test_a_run_stopped_in_a_later_library_keeps_the_earlier_ones_on_disk(tmp_path, monkeypatch):
    from benchmarks import measure

    measure_phase = measure._measure_phase

    def stopped_in_e3nn(lib, *args):
        if lib == "e3nn":
            raise SystemExit("the device tool's time limit")
        return measure_phase(lib, *args)

    monkeypatch.setattr(measure, "_measure_phase", stopped_in_e3nn)
    with pytest.raises(SystemExit):
        run.main(["--smoke", "--configs", "tiny-uvu", "--dtype", "float64", "--phases", "fwd,bwd",
                  "--libs", "jax_cgtp,e3nn", "--out", str(tmp_path), "--tag", "stopped"])
    saved = json.loads((tmp_path / report.file_names("stopped")["json"]).read_text())
    assert [row["phase"] for row in saved["rows"]] == ["fwd", "bwd"]
    for row in saved["rows"]:
        assert row["results"]["jax_cgtp"]["status"] == "ok" and row["memory_floor_ms"] > 0
        assert "e3nn" not in row["results"]


def test_edge_sharding_counts_the_bytes_every_all_reduce_carries():
    hlo = "\n".join([
        "  %psum.5 = f32[250,3264]{1,0} all-reduce(%wrapped_scatter), channel_id=1",
        "  %ars = (f64[10,3]{1,0}, f32[7]{0}) all-reduce-start(%a, %b), channel_id=2",
        "  %ard = (f64[10,3]{1,0}, f32[7]{0}) all-reduce-done(%ars)",
        "  %ag = f32[500,16]{1,0} all-gather(%c), dimensions={0}",
    ])
    assert edge_sharding.all_reduced_bytes(hlo) == 4 * 250 * 3264 + 8 * 30 + 4 * 7
    assert edge_sharding.all_reduced_bytes("%x = f32[4]{0} add(%a, %b)") == 0


def test_sanitizer_workload_runs_every_phase_on_padded_graphs(capsys):
    """The product's three phases and both convolution variants' three phases, each once, with
    padding edges of every kind (int64 indices past 2**32 among them) whose values are NaN: all finite."""
    assert sanitize.main(["--configs", "tiny-uvu", "--random", "1", "--seed", "2", "--backend", "reference",
                          "--edges", "40", "--cases", "float64:int64"]) == 0
    lines = capsys.readouterr().out.splitlines()
    runs = [line for line in lines if line.startswith(("tiny-uvu float64 int64", "random-2-0 float64 int64"))]
    assert len(runs) == 2 * 9 and all(": ok (" in line for line in runs)
    assert lines[-1] == "0 run(s) not ok"
    src, dst, real = sanitize.padded_graph(64, 8, jnp.int64)
    assert {-1, 8, 2**31 - 1, 2**32 + 3, -(2**40)} <= set(np.asarray(src).tolist()) | set(np.asarray(dst).tolist())
    assert (~real).sum() == 15 and (np.asarray(dst)[-16:] == 7).all()


def test_random_suite_draws_realistic_problems_of_every_family():
    """The same problems for the same seed; every family among 40 problems; each builds into a
    product whose multiplicities and l are those of MLIPs."""
    names = random_suite.parse_suite("random:40:0")
    assert names == random_suite.suite(40, 0) and len(names) == 40
    families = {configs.CONFIGS[name]["family"] for name in names}
    assert families == set(random_suite.FAMILIES)
    for name in names:
        config = configs.CONFIGS[name]
        assert config == random_suite.random_config(int(config["source"].split()[-1]))
        tp = problems.build(name, backend="reference")
        assert tp.weight_numel > 0 and max(ir.l for _, ir in tp.irreps_in2) <= 5
        assert config["shared_weights"] == (config["family"] == "self_connection")
    assert random_suite.parse_suite("public") is None


def test_random_suite_runs_every_phase_with_the_peers_that_can_express_it(tmp_path, capsys):
    """``--suite random:COUNT:SEED`` at smoke size: a species self-connection (one row of weights for
    every edge), a fully connected product and channelwise ones, each with every peer that can run
    it, and the per-phase summary over them."""
    result = run.main(["--smoke", "--suite", "random:3:1", "--libs", "jax_cgtp,e3nn", "--phases",
                       "fwd,bwd,conv_fwd", "--dtype", "float64", "--out", str(tmp_path), "--no-plots"])
    assert {row["config"] for row in result["rows"]} == {"random-1-0", "random-1-1", "random-1-2"}
    assert configs.CONFIGS["random-1-2"]["shared_weights"]
    for row in result["rows"]:
        assert row["results"]["jax_cgtp"]["status"] == "ok" and row["results"]["e3nn"]["status"] == "ok"
    shared = next(row for row in result["rows"] if row["config"] == "random-1-2" and row["phase"] == "fwd")
    problem = problems.build("random-1-2", backend="reference").problem
    assert shared["min_bytes"] == cost.min_bytes(problem, "fwd", shared["edges"], 0, 8, shared_weights=True)
    text = capsys.readouterr().out
    assert "per phase: jax_cgtp's speedup over the fastest peer" in text
    assert re.search(r"^conv_fwd\s+float64\s+3\s", text, re.M)


def test_e3j_runs_the_channelwise_rows_and_reports_what_it_cannot_express(tmp_path):
    """InstaDeep's e3j as a peer (``--libs ...,e3j``): its channelwise product and convolution in its
    own layout agree with jax_cgtp's; a fully connected (``uvw``) product is reported unsupported."""
    pytest.importorskip("e3j")
    result = run.main(["--smoke", "--configs", "tiny-uvu,tiny-uvw", "--libs", "jax_cgtp,e3j", "--phases",
                       "fwd,bwd,conv_fwd,conv_dbwd", "--dtype", "float64", "--out", str(tmp_path), "--no-plots"])
    by_config = {}
    for row in result["rows"]:
        by_config.setdefault(row["config"], []).append(row["results"]["e3j"])
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-12 for r in by_config["tiny-uvu"])
    assert all(r["status"] == "unsupported" and "uvw" in r["error"] for r in by_config["tiny-uvw"])
