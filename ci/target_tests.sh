#!/usr/bin/env bash
# The tests of one engine target (vllm, sglang) in a virtual environment of its own,
# .venv-NAME: the project with its test extra, the engine on the CPU
# (overlapcheck/targets/NAME/install-cpu.sh), a smoke run, then
# tests/targets/test_NAME_*.py. Exit status: nonzero on any failure; pytest's exit code 5
# (no tests ran) is a failure. Usage, from anywhere:  bash ci/target_tests.sh vllm
set -uo pipefail
name="${1:-}"
cd "$(dirname "$0")/.."
if [ ! -f "overlapcheck/targets/$name/install-cpu.sh" ]; then
    echo "usage: bash ci/target_tests.sh NAME (a target with an install-cpu.sh: vllm, sglang)"
    exit 2
fi
venv=".venv-$name"
start=$(date +%s)
python3 -m venv "$venv" || exit 1
# shellcheck disable=SC1090
. "$venv/bin/activate"
python -m pip install -q torch==2.13.0 -e '.[test]' || { echo "install failed"; exit 1; }
if ! bash "overlapcheck/targets/$name/install-cpu.sh" python > "$venv/install-target.log" 2>&1; then
    tail -n 20 "$venv/install-target.log"
    echo "target $name: install failed"
    exit 1
fi
echo "target $name: installed in $(( $(date +%s) - start )) s, $(du -sh "$venv" | cut -f1)"
# the engine must really be there: its tests skip without it
overlapcheck run --target "$name" --requests 2 --seed 1 > /dev/null || {
    echo "target $name: the smoke run failed"; exit 1; }
python -m pytest -n auto tests/targets/test_"$name"_*.py
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests for target $name: failing"
    exit 1
fi
echo "target $name: done in $(( $(date +%s) - start )) s"
exit "$rc"
