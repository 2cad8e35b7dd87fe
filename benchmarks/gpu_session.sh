#!/usr/bin/env bash
# One GPU session on the device machine: install the carried wheels, build OpenEquivariance's
# JAX extension and jax_cgtp, print the machine, run `pytest -m gpu`, run the benchmark.
#
# Run from the repository root with carry=[".whl"] (filled by ../shared/gpu/fetch-wheels.sh
# --with-cue --with-oeq --with-e3j) or, for --mlip, carry=[".whl-mlip"] (see the wheel step below):
#   bash benchmarks/gpu_session.sh [options] [-- more benchmarks.run arguments]
# Options (or the environment variable in brackets):
#   --phases LIST    [BENCH_PHASES]   default: fwd,bwd,dbwd,conv_fwd,conv_bwd,conv_dbwd
#   --configs LIST   [BENCH_CONFIGS]  default: the public suite
#   --dtype LIST     [BENCH_DTYPES]   default: float32,float64
#   --libs LIST      [BENCH_LIBS]     default: jax_cgtp,e3nn,cueq,oeq
#   --tag NAME       [BENCH_TAG]      suffix of the result files (default: from phases/configs/dtypes)
#                    (named rows alone, not every config x phase x dtype: no --phases, --configs or
#                    --dtype, and -- --rows CONFIG:PHASE:DTYPE,... for benchmarks.run)
#   --per-gpu        [BENCH_PER_GPU=1] on a machine of N GPUs, N benchmark processes, one per GPU, share the
#                                     groups of rows (benchmarks.run --claims): each row is measured on one
#                                     GPU with its peers, in bench-TAG-gpuK.json/txt/log; merge them here with
#                                     python -m benchmarks.report F... --out DIR (each row keeps its run's floors)
#   --skip-tests     [SKIP_TESTS=1]   do not run pytest -m gpu
#   --skip-bench     [SKIP_BENCH=1]   set up (and test) only
#   --pytest-args S  [PYTEST_ARGS]    pytest arguments of the main test run (default tests/test_gpu.py),
#                                     word-split: no quoted -k expressions (use --pytest-k)
#   --pytest-k EXPR  [PYTEST_K]       the main run's -k expression (default "not thirty_million")
#   --workers N      [PYTEST_WORKERS] pytest-xdist workers sharing the GPU for the main run (default 4)
#   --spread         [PYTEST_GPU_SPREAD=N] on a machine of N GPUs, worker K of the main run sees
#                                     GPU K mod N alone (tests/conftest.py): single-GPU tests on every
#                                     GPU; the two-GPU tests skip there (run them with --workers 0)
#   --skip-large     [SKIP_LARGE=1]   do not run the 30M-edge tests (their own run, one at a time,
#                                     stopped after LARGE_SECONDS, default 240)
#   --mlip ARGS      [MLIP_ARGS]      run examples/mlip_models.py ARGS (mlip's NequIP and MACE MD and training
#                                     steps; e.g. "--routes e3nn,jax_cgtp,e3j") after the tests: mlip.txt;
#                                     stopped at --seconds
#   --e2e            [RUN_E2E=1]      run examples/bench_e2e.py (MD and training step, jax_cgtp vs
#                                     e3nn-jax; needs the ase and matscipy wheels in .whl) after the tests,
#                                     stopped after E2E_SECONDS (default 300); E2E_ARGS (word-split) go
#                                     to bench_e2e.py, e.g. "--workloads train --profile 25"
#   --seconds N      [SESSION_SECONDS] the call's time limit (default 570): the benchmark starts no
#                    new group of rows after N - 90 s from the start of this script, so its
#                    files are written before the device tool stops the call
#   --sharding       [RUN_SHARDING=1] after the tests, run python -m benchmarks.edge_sharding (a convolution on
#                                     one GPU against its edges split across all of them; needs two GPUs or
#                                     more) with SHARDING_ARGS (word-split), writing edge-sharding.json/txt
#                                     after each row; stopped at --seconds
#   --base DIR       [BASE_TREE]      A/B in one call: DIR is a plain copy of another commit's tree
#                                     (git archive REV | tar -x -C .ab/base; carry .ab too), built and
#                                     benchmarked first, jax_cgtp alone (and jax_cgtp_det where --libs
#                                     names it), with the same phases, configs,
#                                     dtypes and arguments after -- (bench-TAG-base.json/txt;
#                                     BASE_COMMIT names it); then
#                                     this tree is built and everything else runs as usual
#   --ab ARGS        [AB_ARGS]        after the benchmark, python -m benchmarks.ab ARGS (word-split: variants
#                                     without spaces), every round kept in ab.json; stopped at --seconds
#   --sanitize ARGS  [SANITIZE_ARGS]  after the tests, python -m benchmarks.sanitize ARGS (word-split): its kernels
#                                     compiled first (--precompile, in parallel), then one run under each of
#                                     compute-sanitizer's tools SANITIZE_TOOLS (default "memcheck racecheck
#                                     initcheck"), kernels named cgtp* only, with XLA's platform allocator:
#                                     sanitizer-TOOL.log each; stopped at --seconds
#   --ncu SPECS      [NCU_SPECS]      after the benchmark, profile each CONFIG:PHASE:DTYPE[:LIB[:SETTINGS]]
#                                     of the comma-separated list with Nsight Compute (every kernel of one
#                                     run after a warm-up; python -m benchmarks.profile; LIB jax_cgtp
#                                     (default), jax_cgtp_det, cueq, oeq or e3nn; SETTINGS as
#                                     benchmarks.profile's --set, e.g. ahead_depth=0): ncu.txt
# A copy of the tree without .git cannot name its commit, and the device's copy of .git can be
# stale: pass JAX_CGTP_GIT_COMMIT=<sha[-dirty]> as a literal, taken from this machine's checkout.
# A later call on the same machine that runs python -m benchmarks.* itself, after --skip-tests
# --skip-bench, needs what this script exports: PYTHONPATH=$SITE plus OpenEquivariance's source
# directory ($OEQ_SRC/openequivariance-*), and OEQ_NOTORCH=1; without them oeq is reported missing.
# Files written to $OUT (keep them few, at most 8 come back): setup.log, gpu-tests.log,
# gpu-tests-large.log, e2e.txt, mlip.txt, edge-sharding.json, edge-sharding.txt, bench-TAG.json, bench-TAG.txt, bench-TAG.log, speedup-TAG.png, roofline-TAG.png,
# bench-TAG-gpuK.json/txt/log (--per-gpu),
# bench-TAG-base.json, bench-TAG-base.txt, ab.json, ncu.txt, sanitizer-TOOL.log (pass -- --no-plots to drop the
# two PNGs).
set -uo pipefail
export PYTHONUNBUFFERED=1

PHASES=${BENCH_PHASES:-}; CONFIGS=${BENCH_CONFIGS:-}; DTYPES=${BENCH_DTYPES:-}; LIBS=${BENCH_LIBS:-}
TAG=${BENCH_TAG:-}; SESSION_SECONDS=${SESSION_SECONDS:-570}; SKIP_TESTS=${SKIP_TESTS:-0}; SKIP_BENCH=${SKIP_BENCH:-0}; PYTEST_ARGS=${PYTEST_ARGS:-}; PYTEST_K=${PYTEST_K:-}
PYTEST_WORKERS=${PYTEST_WORKERS:-4}; SKIP_LARGE=${SKIP_LARGE:-0}; RUN_E2E=${RUN_E2E:-0}; RUN_SHARDING=${RUN_SHARDING:-0}
MLIP_ARGS=${MLIP_ARGS:-}
BENCH_PER_GPU=${BENCH_PER_GPU:-0}; BASE_TREE=${BASE_TREE:-}; NCU_SPECS=${NCU_SPECS:-}; AB_ARGS=${AB_ARGS:-}
SANITIZE_ARGS=${SANITIZE_ARGS:-}; SANITIZE_TOOLS=${SANITIZE_TOOLS:-memcheck racecheck initcheck}
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --phases) PHASES=$2; shift 2 ;;
    --configs) CONFIGS=$2; shift 2 ;;
    --dtype) DTYPES=$2; shift 2 ;;
    --libs) LIBS=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    --per-gpu) BENCH_PER_GPU=1; shift ;;
    --skip-tests) SKIP_TESTS=1; shift ;;
    --skip-bench) SKIP_BENCH=1; shift ;;
    --pytest-args) PYTEST_ARGS=$2; shift 2 ;;
    --pytest-k) PYTEST_K=$2; shift 2 ;;
    --seconds) SESSION_SECONDS=$2; shift 2 ;;
    --workers) PYTEST_WORKERS=$2; shift 2 ;;
    --spread) PYTEST_GPU_SPREAD=$(nvidia-smi -L | grep -c '^GPU'); shift ;;
    --skip-large) SKIP_LARGE=1; shift ;;
    --e2e) RUN_E2E=1; shift ;;
    --mlip) MLIP_ARGS=$2; shift 2 ;;
    --sharding) RUN_SHARDING=1; shift ;;
    --base) BASE_TREE=$2; shift 2 ;;
    --ab) AB_ARGS=$2; shift 2 ;;
    --ncu) NCU_SPECS=$2; shift 2 ;;
    --sanitize) SANITIZE_ARGS=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "gpu_session.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SITE=${SITE:-/tmp/site}; OEQ_SRC=${OEQ_SRC:-/tmp/oeq-src}
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export OEQ_NOTORCH=1                                   # OpenEquivariance: JAX only, no PyTorch
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}
SETUP="$OUT/setup.log"; : > "$SETUP"
step() { echo "== $* ($(date -u +%H:%M:%S))" | tee -a "$SETUP"; }

step "install the carried wheels into $SITE"
# .whl: the kernel peers' wheels (fetch-wheels.sh --with-cue --with-oeq --with-e3j); .whl-mlip: mlip,
# its dependencies and e3j (fetch-wheels.sh --with-e3j --with-mlip, moved there): the two together
# exceed one call's 64 MiB, so a call carries the set it needs.
wheels=$(ls .whl/*.whl .whl-mlip/*.whl 2>/dev/null)
if [ -f "$SITE/.carried-wheels" ] && [ "$wheels" = "$(cat "$SITE/.carried-wheels")" ]; then
  echo "already installed (warm machine)" | tee -a "$SETUP"
elif [ -n "$wheels" ]; then
  # shellcheck disable=SC2086
  if python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" $wheels >>"$SETUP" 2>&1; then
    echo "$wheels" > "$SITE/.carried-wheels"
  else
    echo "wheel install failed (see setup.log)" | tee -a "$SETUP"
  fi
else
  echo "no .whl/*.whl or .whl-mlip/*.whl: pass carry=[\".whl\"] (peers will be reported missing)" | tee -a "$SETUP"
fi

step "OpenEquivariance: build the JAX extension offline, put the source on PYTHONPATH"
ext=$(ls .whl/openequivariance_extjax-*.tar.gz 2>/dev/null | head -n1)
src=$(ls .whl/openequivariance-*.tar.gz 2>/dev/null | head -n1)
if [ -n "$ext" ] && [ -n "$src" ]; then
  if ! python3 -c "import openequivariance_extjax" >/dev/null 2>&1; then
    python3 -m pip install -q --no-build-isolation --no-deps --no-index --target "$SITE" "$ext" >>"$SETUP" 2>&1 \
      || echo "openequivariance_extjax build failed (see setup.log)" | tee -a "$SETUP"
  fi
  mkdir -p "$OEQ_SRC" && tar -xzf "$src" -C "$OEQ_SRC"
  src_dir=$(ls -d "$OEQ_SRC"/openequivariance-*/ | head -n1)
  export PYTHONPATH="${src_dir%/}:$PYTHONPATH"
else
  echo "no OpenEquivariance archives in .whl (fetch-wheels.sh --with-oeq)" | tee -a "$SETUP"
fi

bench_args() {  # the benchmark's options, with a time budget of $1 seconds
  args=(--out "$OUT" --time-budget "$1")
  [ -n "$PHASES" ] && args+=(--phases "$PHASES")
  [ -n "$CONFIGS" ] && args+=(--configs "$CONFIGS")
  [ -n "$DTYPES" ] && args+=(--dtype "$DTYPES")
}
if [ -z "$TAG" ]; then
  TAG=$(printf '%s' "${PHASES:-all}-${CONFIGS:-public}-${DTYPES:-both}" | tr -c 'A-Za-z0-9._-' '_' | cut -c1-60)
fi

if [ -n "$BASE_TREE" ]; then
  step "A/B: build and benchmark the base tree $BASE_TREE (${BASE_COMMIT:-unnamed}; log in setup.log)"
  if python3 -m pip install --no-build-isolation --no-deps -e "$BASE_TREE" >>"$SETUP" 2>&1; then
    bench_args "$(( (SESSION_SECONDS - 90 - SECONDS) / 2 ))"
    base_libs=jax_cgtp
    case ",$LIBS," in *,jax_cgtp_det,*) base_libs=jax_cgtp,jax_cgtp_det ;; esac
    (cd "$BASE_TREE" && JAX_CGTP_GIT_COMMIT=${BASE_COMMIT:-unknown} python3 -m benchmarks.run "${args[@]}" \
      ${EXTRA[@]+"${EXTRA[@]}"} --libs "$base_libs" --no-plots --tag "$TAG-base") >>"$SETUP" 2>&1
    echo "base benchmark exit status $?" | tee -a "$SETUP"
  else
    echo "base tree build FAILED (see setup.log)" | tee -a "$SETUP"
  fi
fi

if [ -d "$SITE/e3j_ops" ]; then
  step "e3j_ops: make libcudart.so.13 loadable (it links the CUDA runtime by name)"
  cudart=$(python3 -c 'import glob, os, sys; print(next((f for p in sys.path for f in glob.glob(os.path.join(p or ".", "nvidia", "**", "libcudart.so.13*"), recursive=True)), ""))' 2>/dev/null)
  if [ -n "$cudart" ]; then
    export LD_LIBRARY_PATH="$(dirname "$cudart")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "libcudart: $cudart" | tee -a "$SETUP"
  else
    echo "no libcudart.so.13 under the nvidia packages: e3j may fall back to its plain-JAX path" | tee -a "$SETUP"
  fi
fi

step "build jax_cgtp in place"
if ! python3 -m pip install --no-build-isolation --no-deps -e . >>"$SETUP" 2>&1; then
  echo "jax_cgtp build FAILED:"; tail -n 40 "$SETUP"; exit 1
fi

step "machine and versions"
nvidia-smi 2>&1 | tee -a "$SETUP"
python3 - <<'EOF' 2>&1 | tee -a "$SETUP"
import importlib, os, subprocess
for name in ("jax", "jaxlib", "jax_cgtp", "e3nn_jax", "cuequivariance", "cuequivariance_jax",
             "cuequivariance_ops_jax", "einops", "networkx", "opt_einsum", "jinja2",
             "openequivariance_extjax", "openequivariance.jax", "e3j", "e3j_ops", "mlip"):
    try:
        module = importlib.import_module(name)
        print(f"  {name:24s} {getattr(module, '__version__', 'ok')}")
    except Exception as error:
        print(f"  {name:24s} NOT IMPORTABLE: {type(error).__name__}: {error}")
import jax
print("  devices:", jax.devices())
EOF
if [ -z "${JAX_CGTP_GIT_COMMIT:-}" ] && ! git rev-parse HEAD >/dev/null 2>&1; then
  echo "warning: no .git here and JAX_CGTP_GIT_COMMIT unset: the JSON will say commit 'unknown'" | tee -a "$SETUP"
fi

tests_rc=0
if [ "$SKIP_TESTS" != 1 ]; then
  # The workers share the GPU: each allocates what it uses instead of a fixed fraction.
  step "pytest -m gpu, $PYTEST_WORKERS workers, without the 30M-edge tests (log: gpu-tests.log)"
  # shellcheck disable=SC2086
  # One line per test (-v), and interrupted (SIGINT) 30 s before the call's limit: pytest still
  # writes its summary, and the log names every test that ended.
  PYTEST_GPU_SPREAD=${PYTEST_GPU_SPREAD:-0} XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -s INT "$(( SESSION_SECONDS - 30 - SECONDS ))" \
    python3 -m pytest -m gpu -v -p no:cacheprovider --durations=25 \
    -n "$PYTEST_WORKERS" -k "${PYTEST_K:-not thirty_million}" ${PYTEST_ARGS:-tests/test_gpu.py} 2>&1 \
    | tee "$OUT/gpu-tests.log" | grep -v "PASSED\|SKIPPED" | tail -n 40
  tests_rc=${PIPESTATUS[0]}
  echo "pytest -m gpu exit status $tests_rc" | tee -a "$SETUP"
  if [ "$SKIP_LARGE" != 1 ]; then
    step "pytest -m gpu -k thirty_million, one at a time (log: gpu-tests-large.log)"
    timeout "${LARGE_SECONDS:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=5 -k thirty_million tests/test_gpu.py 2>&1 \
      | tee "$OUT/gpu-tests-large.log" | tail -n 25
    large_rc=${PIPESTATUS[0]}
    echo "pytest -m gpu -k thirty_million exit status $large_rc" | tee -a "$SETUP"
    [ "$large_rc" = 0 ] || tests_rc=$large_rc
  fi
fi

sanitize_rc=0
if [ -n "$SANITIZE_ARGS" ]; then
  SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -n1)
  step "benchmarks.sanitize $SANITIZE_ARGS: compile its kernels"
  # shellcheck disable=SC2086
  timeout "$(( SESSION_SECONDS - SECONDS ))" python3 -m benchmarks.sanitize $SANITIZE_ARGS --precompile 2>&1 | tail -n 3
  for tool in $SANITIZE_TOOLS; do
    step "compute-sanitizer --tool $tool (sanitizer-$tool.log)"
    # shellcheck disable=SC2086
    XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false \
      timeout "$(( SESSION_SECONDS - 20 - SECONDS ))" "${SANITIZER:-compute-sanitizer}" --tool "$tool" \
      --kernel-name kns=cgtp --print-limit 20 python3 -m benchmarks.sanitize $SANITIZE_ARGS >"$OUT/sanitizer-$tool.log" 2>&1
    rc=$?
    echo "$tool exit status $rc: $(grep -h 'ERROR SUMMARY\|run(s) not ok' "$OUT/sanitizer-$tool.log" | tr '\n' ' ')" | tee -a "$SETUP"
    [ "$rc" = 0 ] || sanitize_rc=$rc
  done
fi

if [ "$RUN_E2E" = 1 ]; then
  step "examples/bench_e2e.py (log: e2e.txt)"
  (cd examples && timeout "${E2E_SECONDS:-300}" python3 bench_e2e.py ${E2E_ARGS:-}) 2>&1 | tee "$OUT/e2e.txt" | tail -n 20
  echo "bench_e2e exit status ${PIPESTATUS[0]}" | tee -a "$SETUP"
fi

if [ -n "$MLIP_ARGS" ]; then
  step "examples/mlip_models.py $MLIP_ARGS (log: mlip.txt)"
  # shellcheck disable=SC2086
  (cd examples && timeout "$(( SESSION_SECONDS - 10 - SECONDS ))" python3 mlip_models.py $MLIP_ARGS) 2>&1 \
    | tee "$OUT/mlip.txt" | tail -n 30
  echo "mlip_models exit status ${PIPESTATUS[0]}" | tee -a "$SETUP"
fi

if [ "$RUN_SHARDING" = 1 ]; then
  step "python3 -m benchmarks.edge_sharding ${SHARDING_ARGS:-} (log: edge-sharding.txt)"
  # shellcheck disable=SC2086
  timeout "$(( SESSION_SECONDS - SECONDS ))" python3 -m benchmarks.edge_sharding --out "$OUT/edge-sharding" \
    ${SHARDING_ARGS:-} 2>&1 | tail -n 30
  echo "edge_sharding exit status ${PIPESTATUS[0]}" | tee -a "$SETUP"
fi

bench_rc=0
if [ "$SKIP_BENCH" != 1 ]; then
  bench_args "$(( SESSION_SECONDS - 90 - SECONDS ))"
  [ -n "$LIBS" ] && args+=(--libs "$LIBS")
  if [ "$BENCH_PER_GPU" = 1 ]; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); claims=$(mktemp -d)
    [ "$gpus" -ge 1 ] || { echo "--per-gpu: nvidia-smi -L lists no GPU" | tee -a "$SETUP"; exit 1; }
    step "python3 -m benchmarks.run ${args[*]} ${EXTRA[*]:-}, one process on each of $gpus GPUs (logs: bench-$TAG-gpuK.log)"
    pids=()
    for gpu in $(seq 0 $(( gpus - 1 ))); do
      CUDA_VISIBLE_DEVICES=$gpu python3 -m benchmarks.run "${args[@]}" ${EXTRA[@]+"${EXTRA[@]}"} --no-plots \
        --claims "$claims" --tag "$TAG-gpu$gpu" >"$OUT/bench-$TAG-gpu$gpu.log" 2>&1 &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || bench_rc=$?; done
    for gpu in $(seq 0 $(( gpus - 1 ))); do echo "== GPU $gpu"; tail -n 25 "$OUT/bench-$TAG-gpu$gpu.log"; done
  else
    args+=(--tag "$TAG")
    step "python3 -m benchmarks.run ${args[*]} ${EXTRA[*]:-} (log: bench-$TAG.log)"
    python3 -m benchmarks.run "${args[@]}" ${EXTRA[@]+"${EXTRA[@]}"} 2>&1 | tee "$OUT/bench-$TAG.log" | grep -v '^\['
    bench_rc=${PIPESTATUS[0]}
  fi
  echo "benchmark exit status $bench_rc" | tee -a "$SETUP"
fi

ab_rc=0
if [ -n "$AB_ARGS" ]; then
  step "python3 -m benchmarks.ab $AB_ARGS (ab.json)"
  # shellcheck disable=SC2086
  timeout "$(( SESSION_SECONDS - SECONDS ))" python3 -m benchmarks.ab $AB_ARGS --json "$OUT/ab.json" 2>&1 | grep -v '^\['
  ab_rc=${PIPESTATUS[0]}
  echo "ab exit status $ab_rc" | tee -a "$SETUP"
fi

if [ -n "$NCU_SPECS" ]; then
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1)
  for spec in ${NCU_SPECS//,/ }; do
    IFS=: read -r cfg phase dtype lib settings <<<"$spec"
    lib=${lib:-jax_cgtp}
    step "Nsight Compute: $cfg $phase $dtype $lib $settings (ncu.txt)"
    echo "== $cfg $phase $dtype $lib $settings" >>"$OUT/ncu.txt"
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 300 "${NCU:-ncu}" --clock-control none --profile-from-start off \
      --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --metrics 'dram__bytes_read.sum,dram__bytes_write.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
      python3 -m benchmarks.profile "$cfg" "$phase" "$dtype" --lib "$lib" --set "$settings" >>"$OUT/ncu.txt" 2>&1
    echo "ncu exit status $?" | tee -a "$SETUP"
  done
fi

ls -la "$OUT"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ] && [ "$ab_rc" = 0 ] && [ "$sanitize_rc" = 0 ]
