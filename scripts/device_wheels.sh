#!/usr/bin/env bash
# Wheels that a GPU machine without a package registry needs to run gpubench (it has torch,
# torchvision, psutil, rich, pillow, matplotlib, nvidia-ml-py; not Hydra nor Optuna, nor torchdata,
# and a filelock older than 4.2). MLflow is
# left out: run there with tracking=none and sync the run folders to MLflow afterwards
# (python -m gpubench.tracking sync outputs).
#   bash scripts/device_wheels.sh [DIR]     (default .whl; add it to .git/info/exclude)
# Then on the machine: pip install --no-index --no-deps --target /tmp/site DIR/*.whl and
# PYTHONPATH=/tmp/site:. python -m gpubench ...
set -euo pipefail
dir=${1:-.whl}
mkdir -p "$dir"
py=${PYVER:-3.12}
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dir" hydra-core==1.3.8 omegaconf==2.3.1 optuna==5.0.0 sqlalchemy==2.1.9 alembic==1.20.1 \
  colorlog==6.12.0 mako==1.4.3 greenlet \
  filelock==4.2.12 torchdata==0.11.0
# antlr4-python3-runtime 4.9.3 (what omegaconf 2.3 needs) is published as a source archive
# only: build its pure-Python wheel here
python3 -m pip wheel -q --no-deps -w "$dir" antlr4-python3-runtime==4.9.3
ls -1 "$dir"
