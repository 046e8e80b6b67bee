#!/usr/bin/env bash
# The GPU validation plan (docs/benchmarks.md, "On a GPU"), one part per call so each fits in a
# 10-minute command on a lent GPU machine. Run from the repo root there, with the wheels from
# scripts/device_wheels.sh carried in .whl:
#   bash scripts/gpu_validation.sh tests|default|compute|workers|harness|monitor|sweep
# Logs go to $OUT (or ./gpu_logs), one file per part.
set -uo pipefail
part=${1:?part: tests default compute workers harness monitor sweep}
out=${OUT:-gpu_logs}
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
log="$out/$part.log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$log"
python3 -c "import torch, os; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cpus', os.cpu_count())" | tee -a "$log"
# resnet50 with a 10,000-class head at 224 px: reference article 003's setting
R50="model=resnet50 dataset.num_classes=10000 dataset.image_size=224 tracking=none"
gb() { echo "+ gpubench $*" | tee -a "$log"; python3 -m gpubench "$@" 2>&1 | tee -a "$log"; }
case $part in
  tests)   python3 -m pytest -q tests/test_gpu.py tests/test_data.py -m gpu 2>&1 | tee -a "$log" ;;
  default) gb tracking=none ;;
  compute) # the compute bound: precision x channels_last x batch on a batch already on the GPU
    gb -m $R50 dataset=device_synthetic 'bench.phases=[compute]' bench.steps=30 \
      precision=fp32,amp_fp16,amp_bf16 channels_last=false,true loader.batch_size=64,128,256
    gb $R50 dataset=device_synthetic 'bench.phases=[compute]' precision=amp_bf16 \
      channels_last=true loader.batch_size=256 compile=default bench.warmup_steps=10 ;;
  workers) # the data side on real JPEG decode: loader and e2e per worker count
    gb -m $R50 dataset=fake_jpeg dataset.num_samples=2048 precision=amp_bf16 channels_last=true \
      loader.batch_size=128 loader.pin_memory=true loader.num_workers=1,2,4,8,12 bench.steps=40 ;;
  harness) python3 scripts/bench_overhead.py model=resnet50 dataset.image_size=224 \
      dataset.num_classes=10000 loader.batch_size=128 precision=amp_bf16 channels_last=true \
      bench.device=cuda bench.steps=50 --repeats 5 2>&1 | tee -a "$log" ;;
  monitor) # NVML sampler cost: e2e with the sampler on vs off, alternated
    for i in 1 2 3; do for m in true false; do
      gb $R50 dataset=device_synthetic 'bench.phases=[e2e]' precision=amp_bf16 \
        loader.batch_size=128 bench.steps=100 bench.monitor=$m | grep -E "^\+|e2e"
    done; done ;;
  sweep)   gb $R50 sweep=throughput dataset=fake_jpeg dataset.num_samples=2048 \
      hydra.sweeper.n_trials=12 bench.steps=30 hydra.sweep.dir=outputs/gpu_sweep
    python3 -m gpubench.report outputs/gpu_sweep 2>&1 | tee -a "$log"
    cp outputs/gpu_sweep/report/experiment/recommended.yaml "$out/" 2>/dev/null ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
