#!/usr/bin/env bash
# Install the vLLM target's engine into the current Python environment, CPU only:
# vllm 0.33.0 without its dependencies (they pull a CUDA torch), its light dependencies,
# all under the constraint file that pins the CPU torch. Usage (from the repository root):
#   bash overlapcheck/targets/vllm/install-cpu.sh [PYTHON]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${1:-python}"
c="$here/../constraints-cpu.txt"
"$py" -m pip install -c "$c" torch==2.13.0
"$py" -m pip install -c "$c" --no-deps vllm==0.33.0
# the light deps take only the torch pin: the shared file also holds SGLang's pins
# (openai==2.8.0, xgrammar==0.2.7), which vllm 0.33.0 cannot use (openai>=2.25, xgrammar==0.2.8)
t="$(mktemp)"; trap 'rm -f "$t"' EXIT
grep -E '^torch==' "$c" > "$t"
"$py" -m pip install -c "$t" -r "$here/requirements-cpu.txt"
