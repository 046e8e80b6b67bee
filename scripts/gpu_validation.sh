#!/usr/bin/env bash
# The GPU validation plan (docs/gpu.md, docs/benchmarks.md "On a GPU"): what a CPU cannot check.
# One part per call so each fits in a 10-minute command on a lent GPU machine, all of them in
# about 30 minutes. Run from the repo root there, with the wheels from scripts/device_wheels.sh
# carried in .whl:
#   bash scripts/gpu_validation.sh PART
# Parts, most important first (minutes on one H100, roughly):
#   check      (3) python -m gpubench.check: gpubench's figures against plain loops, the verdict
#                  on known cases, NVML, energy, memory, the peak table; and the same check
#                  with a stalled step, which must FAIL (a check that cannot fail proves nothing)
#   review     (4) the gpu-marked tests: OOM texts, peak row, NVML fields, nvJPEG side stream,
#                  pinned labels, torch_default flags, compile reset, memory gate, energy
#   precision  (3) compute bound under torch_default / fp32 / tf32 / amp_bf16
#   devicedata (4) device decode + augment: e2e against min(loader, compute) and the combined
#                  bound 1/(1/compute + device data time per image)
#   compile    (6) one process, several batch sizes, compile on, short warm-up cap: no false
#                  over_ceiling, a minimum of warm-up steps after the compile
#   idle       (3) host data wait vs device idle from events
#   memory     (2) the memory gate: torch reserved vs device memory in use
#   step       (6) the step knobs and the profile breakdown: gpu_metrics.csv (GPM columns on
#                  Hopper), device busy/idle and H2D overlap from a trace, grad accumulation,
#                  per-step host metrics' cost, fused AdamW, checkpointing's memory
#   default compute workers harness monitor sweep: the earlier plan, each with CHECK lines
# Logs go to $OUT (or ./gpu_logs), one file per part, and only logs and figures: the runs
# themselves are written under $SCRATCH (default /tmp/gpubench_validation). Every part ends
# in CHECK lines with their figures: "CHECK ok" confirms, "CHECK FAIL" contradicts, and the
# part exits 1 on any CHECK FAIL (a failed command it needs is a CHECK FAIL too).
set -uo pipefail
part=${1:?part: check review precision devicedata compile idle memory step default compute workers harness monitor sweep}
out=${OUT:-gpu_logs}
scratch=${SCRATCH:-/tmp/gpubench_validation}
mkdir -p "$out" "$scratch"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
log="$out/$part.log"
runs="$scratch/runs/$part"
rm -rf "$runs"
nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current --format=csv,noheader | tee "$log"
python3 -c "import torch, os; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cpus', os.cpu_count())" | tee -a "$log"
# resnet50 with a 10,000-class head at 224 px: reference article 003's setting
R50="model=resnet50 dataset.num_classes=10000 dataset.image_size=224 tracking=none"
gb() { echo "+ gpubench $*" | tee -a "$log"; python3 -m gpubench "$@" 2>&1 | tee -a "$log"; }
# check NAME 'python expression over r (the run dir's results.json as a dict)' RUN_DIR [RUN_DIR2]
# (r2 for the second dir): prints CHECK ok/FAIL with the expression and the value of each
# figure it reads (every r[...], r2[...] and ph(...) in it)
check() {
  python3 - "$@" <<'EOF' | tee -a "$log"
import ast, sys
from gpubench.core.record import load
name, expr, *dirs = sys.argv[1:]
recs = [load(d) for d in dirs]
if any(r is None for r in recs):
    print(f"CHECK FAIL {name}: no results.json in {dirs}"); sys.exit(0)
r, r2 = recs[0].to_dict(), (recs[1].to_dict() if len(recs) > 1 else None)
def ph(d, phase, key):
    return (d.get("phases", {}).get(phase) or {}).get(key)
def shown(v):
    return f"{v:.4g}" if isinstance(v, float) else ("{...}" if isinstance(v, dict) else repr(v))
figs = []
for n in ast.walk(ast.parse(expr, mode="eval")):
    if (isinstance(n, ast.Subscript) and getattr(n.value, "id", "") in ("r", "r2")) or (
            isinstance(n, ast.Call) and getattr(n.func, "id", "") == "ph"):
        src = ast.unparse(n)
        try:
            figs.append(f"{src}={shown(eval(src))}")
        except Exception as e:
            figs.append(f"{src}: {type(e).__name__}")
try:
    ok = bool(eval(expr))
except Exception as e:  # a key the measure code does not write
    print(f"CHECK FAIL {name}: {type(e).__name__}: {e} [{'; '.join(figs)}]"); sys.exit(0)
print(f"CHECK {'ok' if ok else 'FAIL'} {name}: {expr} [{'; '.join(dict.fromkeys(figs))}]")
EOF
}
# pytests NAME ARGS...: tests in one process (-n 0: one GPU, not one xdist worker per core;
# `-p no:xdist` would make pyproject's `-n auto` an unknown option),
# then one CHECK line with pytest's summary
pytests() {
  local name=$1; shift
  python3 -m pytest -q -n 0 -p no:cacheprovider "$@" 2>&1 | tee "$scratch/pytest.out" | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  local summary; summary=$(tail -1 "$scratch/pytest.out")
  if [ "$rc" != 0 ]; then echo "CHECK FAIL $name: pytest exit $rc: $summary" | tee -a "$log"
  elif ! grep -q " passed" <<<"$summary"; then  # all skipped: no CUDA device reached
    echo "CHECK FAIL $name: none ran: $summary" | tee -a "$log"
  else echo "CHECK ok $name: $summary" | tee -a "$log"; fi
}
# status NAME EXPECTED COMMAND...: the command's exit status is the check
status() {
  local name=$1 want=$2; shift 2
  echo "+ $*" | tee -a "$log"
  "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" = "$want" ]; then echo "CHECK ok $name: exit $rc" | tee -a "$log"
  else echo "CHECK FAIL $name: exit $rc, expected $want" | tee -a "$log"; fi
}
finish() { grep -q "^CHECK FAIL" "$log" && exit 1; exit 0; }
case $part in
  check)
    status "gpubench.check passes on this GPU" 0 python3 -m gpubench.check
    # only the tool's step stalled, the plain loop not: the compute check must fail. The stall
    # must outlast the device's queued work: on an H100 a 50 ms sleep every 2nd step of a
    # 71 ms resnet50 step cost 2.4% (the host runs ahead of the device; check passed, 0.976)
    status "gpubench.check fails when only the tool's step is stalled" 1 \
      python3 -m gpubench.check fault.stall_every=1 fault.stall_s=0.2
    finish ;;
  review)
    pytests "gpu-marked tests" -m gpu tests/gpu/test_gpu.py tests/gpu/test_gpu_checks.py tests/parts/test_data.py
    finish ;;
  precision) # finding 2: the default must measure what users run (TF32 convs on Ampere+)
    for p in torch_default fp32 tf32 amp_bf16; do
      gb $R50 dataset=device_synthetic 'bench.phases=[compute]' bench.steps=30 \
        loader.batch_size=128 precision=$p channels_last=true hydra.run.dir=$runs/$p
    done
    check "torch_default runs TF32 convolutions (>1.5x strict fp32)" \
      'r["compute_images_per_sec"] > 1.5 * r2["compute_images_per_sec"]' $runs/torch_default $runs/fp32
    check "torch_default MFU peak mixes tf32 convs and fp32 matmuls" \
      'r["flops_by_kind"]["conv"] > 0 and r["mfu"] is not None and r["mfu"] < 1' $runs/torch_default
    check "tf32 at least as fast as torch_default" \
      'r["compute_images_per_sec"] > 0.9 * r2["compute_images_per_sec"]' $runs/tf32 $runs/torch_default
    finish ;;
  devicedata) # finding 3: device decode/augment share the step's stream in e2e
    gb $R50 dataset=fake_jpeg dataset.num_samples=1024 dataset.decode_on=device \
      dataset.augment_on=device loader.num_workers=4 loader.batch_size=128 precision=amp_bf16 \
      channels_last=true bench.steps=30 hydra.run.dir=$runs/decode
    check "device data time per image measured in the loader phase" \
      'ph(r, "loader", "device_data_seconds_per_image") > 0' $runs/decode
    check "e2e within the combined bound 1/(1/compute + device data time)" \
      'r["images_per_sec"] <= 1.05 / (1 / r["compute_images_per_sec"] + ph(r, "loader", "device_data_seconds_per_image"))' $runs/decode
    check "verdict judged against the combined bound, not min(loader, compute)" \
      'r.get("e2e_bound_images_per_sec") is not None' $runs/decode
    finish ;;
  compile) # findings 4 and 6: trials in one process (basic launcher), compile on
    gb -m $R50 dataset=device_synthetic 'bench.phases=[compute]' precision=amp_bf16 \
      channels_last=true compile=default loader.batch_size=64,128,64 bench.steps=20 \
      bench.warmup_steps=3 bench.warmup_max_seconds=5 hydra.sweep.dir=$runs/sweep
    for j in 0 1 2; do
      check "trial $j: warm-up ran a minimum of steps after the compile step" \
        'ph(r, "compute", "warmup_steps") >= 3' $runs/sweep/$j
      check "trial $j: no compile or CUDA-graph recording inside the window" \
        'ph(r, "compute", "step_time_p95_s") < 3 * ph(r, "compute", "step_time_p50_s")' $runs/sweep/$j
      check "trial $j: ok (no false over_ceiling)" 'r["status"] == "ok"' $runs/sweep/$j
    done
    check "the third trial (batch 64 again) does not carry the first two trials' memory" \
      'r["torch_peak_reserved_bytes"] <= 1.15 * r2["torch_peak_reserved_bytes"]' $runs/sweep/2 $runs/sweep/0
    finish ;;
  idle) # finding 7: host wait is not device idle
    gb $R50 dataset=fake_jpeg dataset.num_samples=1024 loader.num_workers=2 \
      loader.batch_size=128 precision=amp_bf16 channels_last=true 'bench.phases=[e2e]' \
      bench.steps=30 hydra.run.dir=$runs/starved
    gb $R50 dataset=device_synthetic 'bench.phases=[e2e]' precision=amp_bf16 \
      channels_last=true loader.batch_size=128 bench.steps=30 hydra.run.dir=$runs/fed
    check "a data-starved e2e shows device idle from events" \
      'ph(r, "e2e", "device_idle_fraction") > 0.3' $runs/starved
    check "a fed e2e keeps the device busy" 'ph(r, "e2e", "device_idle_fraction") < 0.05' $runs/fed
    check "host wait kept as its own figure" 'ph(r, "e2e", "data_wait_fraction") is not None' $runs/fed
    finish ;;
  memory) # finding 9: memory outside torch's allocator counts against the ceiling
    gb $R50 dataset=device_synthetic precision=amp_bf16 channels_last=true \
      loader.batch_size=256 bench.steps=20 hydra.run.dir=$runs/r50
    check "device memory in use sampled, above torch reserved (context, workspaces)" \
      'ph(r, "compute", "telemetry")["device_used_peak_bytes"] > ph(r, "compute", "memory")["torch_peak_reserved_bytes"]' $runs/r50
    check "memory outside the allocator measured (0.3-4 GB expected)" \
      '0.3e9 < ph(r, "compute", "telemetry")["non_torch_peak_bytes"] < 4e9' $runs/r50
    check "the gate uses the larger figure" \
      'r["peak_memory_bytes"] >= ph(r, "compute", "telemetry")["device_used_peak_bytes"]' $runs/r50
    finish ;;
  step) # the train step's knobs and where its time goes (docs/profiling.md)
    pytests "gpu_metrics.csv on this GPU" -m gpu tests/telemetry/test_gpulog.py -s
    S="$R50 dataset=device_synthetic precision=amp_bf16 channels_last=true loader.batch_size=128 bench.steps=30 'bench.phases=[compute]'"
    gb $R50 dataset=fake_jpeg dataset.num_samples=1024 loader.num_workers=4 precision=amp_bf16 \
      channels_last=true loader.batch_size=128 'bench.phases=[e2e]' bench.steps=20 \
      bench.profile=true bench.profile_steps=5 hydra.run.dir=$runs/profile
    check "breakdown has device busy/idle and H2D overlap" \
      'r["profile"]["breakdown"]["device_busy_s"] > 0 and r["profile"]["breakdown"]["h2d_overlap_fraction"] is not None' $runs/profile
    check "device busy + idle = the device window" \
      'abs(r["profile"]["breakdown"]["device_busy_s"] + r["profile"]["breakdown"]["device_idle_s"] - r["profile"]["breakdown"]["device_window_s"]) < 1e-6' $runs/profile
    check "kernel time attributed to forward, backward and optimizer" \
      'all(r["profile"]["breakdown"][f"device_{p}_s"] > 0 for p in ("forward", "backward", "optimizer"))' $runs/profile
    check "host parts cover the profiled step" 'r["profile"]["breakdown"]["covered"]' $runs/profile
    check "gpu_metrics.csv written with rows" 'r["gpu_metrics"]["rows"] > 5' $runs/profile
    for v in "k1 bench.grad_accum_steps=1" "k4 bench.grad_accum_steps=4" "hm0 bench.host_metrics_every=0" \
             "hm1 bench.host_metrics_every=1" "fused bench.optimizer=adamw bench.optimizer_impl=fused" \
             "foreach bench.optimizer=adamw bench.optimizer_impl=foreach" "ckpt model.checkpointing=true" \
             "cudnn bench.cudnn_benchmark=true"; do
      set -- $v; name=$1; shift
      eval gb $S "$@" hydra.run.dir=$runs/$name
    done
    check "grad accumulation: optimizer steps/sec = micro-batches/sec / 4" \
      'abs(r["step"]["optimizer_steps_per_sec"] * 4 - r["step"]["micro_batches_per_sec"]) < 1e-6' $runs/k4
    check "grad accumulation 4 at least as fast per image as 1 (fewer optimizer steps)" \
      'r["compute_images_per_sec"] >= 0.97 * r2["compute_images_per_sec"]' $runs/k4 $runs/k1
    check "host metrics every step cost something (report the figure)" \
      'r["compute_images_per_sec"] <= r2["compute_images_per_sec"] * 1.02' $runs/hm1 $runs/hm0
    check "checkpointing lowers torch peak reserved at the same batch" \
      'r["torch_peak_reserved_bytes"] < 0.8 * r2["torch_peak_reserved_bytes"]' $runs/ckpt $runs/k1
    check "checkpointing costs compute (slower per image)" \
      'r["compute_images_per_sec"] < r2["compute_images_per_sec"]' $runs/ckpt $runs/k1
    finish ;;
  default) gb tracking=none hydra.run.dir=$runs/default
    check "the default run measures every phase and answers" \
      'r["status"] == "ok" and r["bottleneck"] in ("data", "compute", "overlap", "inconclusive")' $runs/default
    check "NVML read inside the headline windows" \
      'r["gpu_util_mean"] is not None and r["power_mean_w"] is not None and r["energy_per_image_j"] is not None' $runs/default
    check "MFU below 100% of the peak" 'r["mfu"] is None or 0 < r["mfu"] < 1' $runs/default
    finish ;;
  compute) # the compute bound: precision x channels_last x batch on a batch already on the GPU
    gb -m $R50 dataset=device_synthetic 'bench.phases=[compute]' bench.steps=30 \
      precision=torch_default,fp32,amp_fp16,amp_bf16 channels_last=false,true \
      loader.batch_size=64,128,256 hydra.sweep.dir=$runs/grid
    for d in "$runs"/grid/*/; do
      check "compute job $(basename "$d"): measured, MFU below 1" \
        'r["status"] in ("ok", "over_ceiling") and (r["mfu"] is None or r["mfu"] < 1)' "$d"
    done
    gb $R50 dataset=device_synthetic 'bench.phases=[compute]' precision=amp_bf16 \
      channels_last=true loader.batch_size=256 compile=default bench.warmup_steps=10 \
      bench.warmup_max_steps=50 hydra.run.dir=$runs/compiled
    check "compile measured after its warm-up" \
      'r["status"] == "ok" and ph(r, "compute", "warmup_steps") >= 3' $runs/compiled
    finish ;;
  workers) # the data side on real JPEG decode: loader and e2e per worker count
    gb -m $R50 dataset=fake_jpeg dataset.num_samples=2048 precision=amp_bf16 channels_last=true \
      loader.batch_size=128 loader.pin_memory=true loader.num_workers=1,4 bench.steps=40 \
      hydra.sweep.dir=$runs/grid
    check "4 workers load faster than 1 (host JPEG decode scales with workers)" \
      'r["loader_images_per_sec"] > 1.5 * r2["loader_images_per_sec"]' $runs/grid/1 $runs/grid/0
    finish ;;
  harness) python3 scripts/bench_overhead.py model=resnet50 dataset.image_size=224 \
      dataset.num_classes=10000 loader.batch_size=128 precision=amp_bf16 channels_last=true \
      bench.device=cuda bench.steps=50 --repeats 5 2>&1 | tee "$scratch/harness.out" | tee -a "$log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" = 0 ]; then echo "CHECK ok harness overhead measured: $(tail -1 "$scratch/harness.out")" | tee -a "$log"
    else echo "CHECK FAIL harness overhead: exit $rc" | tee -a "$log"; fi
    finish ;;
  monitor) # NVML sampler cost: e2e with the sampler on vs off, alternated
    for i in 1 2 3; do for m in on off; do
      flag=$([ $m = on ] && echo true || echo false)
      gb $R50 dataset=device_synthetic 'bench.phases=[e2e]' precision=amp_bf16 \
        loader.batch_size=128 bench.steps=100 bench.monitor=$flag hydra.run.dir=$runs/$m$i >/dev/null
    done; done
    for i in 1 2 3; do
      check "pair $i: the sampler costs under 3% of e2e" \
        'r["images_per_sec"] > 0.97 * r2["images_per_sec"]' $runs/on$i $runs/off$i
    done
    finish ;;
  sweep)   gb $R50 sweep=throughput dataset=fake_jpeg dataset.num_samples=2048 \
      hydra.sweeper.n_trials=12 bench.steps=30 hydra.sweep.dir=$runs/sweep
    python3 -m gpubench.report $runs/sweep 2>&1 | tee -a "$log"
    cp $runs/sweep/report/experiment/recommended.yaml "$out/" 2>/dev/null
    if [ -s "$out/recommended.yaml" ]; then
      echo "CHECK ok sweep recommended a config: $(tr '\n' ' ' < "$out/recommended.yaml" | cut -c1-200)" | tee -a "$log"
    else echo "CHECK FAIL sweep: no recommended.yaml" | tee -a "$log"; fi
    finish ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
