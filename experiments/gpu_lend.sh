#!/usr/bin/env bash
# What a lent GPU has left to measure for issue 39, in one device call, most needed first
# (whether packages compiled ahead are only loaded where measured passed on an H100, stop 51):
#   1. ResNet-50's float32 row, optimized from an empty cost log (the goal: at most 120 s; 367 s
#      and cut off in stop 51, before inductor's host-CPU probes were made once a machine);
#   2. its accuracy entry (--accuracy 1e-2) on that cost log, so only reduced precisions are measured;
#   3. the torch-entry test (a PyTorch module optimized for CUDA, torch.compile of it a finalist).
# Each step is cut off so that the next has its chance; a step with under a minute left is skipped.
# The Python stacks of the optimizations and of their worker processes (experiments/stacks.py)
# say where their seconds went.
#
#   bash .gpu/part2/install && export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 && bash experiments/gpu_lend.sh 540
#
# SECONDS (the first argument) is the call's own limit less a margin. Everything lands in $OUT:
# steps.txt (each step's exit status and seconds), <step>.log, gpu.json, gpu-costs.sqlite, stacks/.
set -u
deadline=$(($(date +%s) + ${1:-540}))
cp experiments/results/gpu.json /tmp/gpu.json

step() {
    local name=$1 left=$((deadline - $(date +%s) - 10))
    shift
    if ((left < 60)); then
        echo "$name skipped: ${left} s left" >>"$OUT/steps.txt"
        return
    fi
    local started=$(date +%s)
    timeout -k 10 "$left" "$@" >"$OUT/$name.log" 2>&1
    echo "$name exit $? after $(($(date +%s) - started)) s" >>"$OUT/steps.txt"
    cp /tmp/gpu.json "$OUT/" 2>/dev/null || true
    cp /tmp/gpu-costs.sqlite "$OUT/" 2>/dev/null || true
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/steps.txt"
gpu=(python3 -m experiments.gpu --model resnet50 --stacks "$OUT/stacks" --out /tmp/gpu.json --cost-log /tmp/gpu-costs.sqlite)
step resnet50 "${gpu[@]}" --no-torch-entry
step resnet50_accuracy "${gpu[@]}" --accuracy 1e-2 --accuracy-only
step torch_entry python3 -m pytest -q tests/test_backend_inductor.py -k torch_module_on_the_gpu
