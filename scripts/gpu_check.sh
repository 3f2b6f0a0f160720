#!/usr/bin/env bash
# One GPU session's checks, in one script (device time is scarce): kernels vs references on CUDA,
# the >2^31-element cache, the benchmark, and every chapter executed with compiled kernels as
# Colab would run it. Writes logs to ${OUT:-/tmp/gpu_check}/, and the performance results the book
# shows to benchmarks/gpu_results.json (copied to the log folder too): commit that file.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_check}; mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
rc=0
$py scripts/gpu_check.py 2>&1 | tee "$out/kernels.log" || rc=1
cp benchmarks/gpu_results.json "$out/" 2>/dev/null || true
PAGED_KV_TEST_CUDA=1 $py -m pytest -q tests/kernels/test_paged_attention.py -k gpu 2>&1 | tee "$out/large_cache.log" || rc=1
$py -m kernels.bench 2>&1 | tee "$out/bench.log" || rc=1
for nb in book/0*.ipynb; do
  start=$(date +%s)
  if timeout 600 $py -m jupyter nbconvert --to notebook --execute --output-dir "$out" "$nb" >/dev/null 2>"$out/$(basename "$nb").err"; then
    echo "chapter ok   $nb ($(( $(date +%s) - start )) s)"
  else
    echo "chapter FAIL $nb (see $out/$(basename "$nb").err)"; rc=1
  fi
done | tee "$out/chapters.log"
exit $rc
