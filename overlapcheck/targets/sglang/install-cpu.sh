#!/usr/bin/env bash
# Install the SGLang target's engine into the current Python environment, CPU only:
# sglang 0.5.23 without its dependencies (they pull a CUDA torch and CUDA kernels), then
# the dependencies its scheduler imports (requirements-cpu.txt), all under the shared
# constraint file that pins the CPU torch. Usage, from the repository root, in the
# environment overlapcheck is installed in (not the vLLM target's: their pins conflict):
#   bash overlapcheck/targets/sglang/install-cpu.sh [PYTHON]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${1:-python}"
c="$here/../constraints-cpu.txt"
"$py" -m pip install -c "$c" torch==2.13.0
"$py" -m pip install -c "$c" --no-deps sglang==0.5.23
"$py" -m pip install -c "$c" -r "$here/requirements-cpu.txt"
