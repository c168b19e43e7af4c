#!/usr/bin/env bash
# Install the vLLM target's engine into the current Python environment, CPU only:
# vllm 0.33.0 without its dependencies (they pull a CUDA torch), then its light
# dependencies (requirements-cpu.txt), all under the shared constraint file that pins the
# CPU torch. xgrammar (vllm pins 0.2.8) goes without its own dependencies; the rest it
# needs is in requirements-cpu.txt. The real model runner (runner: real) needs stock
# triton 3.9.0 (1 GB: its kernels run in Triton's interpreter) and two packages its model
# loader imports, compressed-tensors and loguru (without their dependencies, which pull
# a CUDA torch); the scheduler with the fake runner needs none of them.
# Usage, from the repository root, in the environment overlapcheck is installed in:
#   bash overlapcheck/targets/vllm/install-cpu.sh [PYTHON]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${1:-python}"
c="$here/../constraints-cpu.txt"
"$py" -m pip install -c "$c" torch==2.13.0
"$py" -m pip install -c "$c" --no-deps vllm==0.33.0 xgrammar==0.2.8
"$py" -m pip install -c "$c" -r "$here/requirements-cpu.txt"
"$py" -m pip install -c "$c" triton==3.9.0
"$py" -m pip install -c "$c" --no-deps compressed-tensors==0.20.0 loguru==0.7.3
