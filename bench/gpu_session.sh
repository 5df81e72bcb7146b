#!/usr/bin/env bash
# One device call that re-checks the Triton backends on a CUDA GPU, from the repository
# root: the benchmark (bench/RESULTS.md, results.json, PNGs), then the CUDA tests in
# ten parallel pytest jobs (JOB_S seconds each at most, default 450), logs concatenated into
# $OUT/cuda_tests.log. On an H200 the bench took 1-6 min and the tests about 5 (most of
# it kernel compilation): past the device tool's 10-minute limit per call together, so
# pass "bench" or "tests" to run one half per call ("bench-both": the benchmark first with
# L2 flushed by a write, BENCH_FLUSH=write, its log and results.json kept aside in $OUT,
# then as "bench"). "quick": the module and routing tests, bench/probe_routing_sources.py
# and probe_eager_host.py alone (host times), then three test jobs on what else changed
# since the last full suite (the GEMV's bulk copies, graphs and syncs), logs in $OUT.
# "probes": the prepared probe_mma.py sets instead (PROBE_SET 13: the table with PDL as
# set and flipped; 14: 64-column tiles with the input through the ring, for Mixtral
# M = 64; 15: odd K splits, for Mixtral M = 4), logs in $OUT/probe_mma_set*.log.
# "wgmma": the warpgroup-MMA kernel (GemmTiles.wgmma; run on an H100 2026-12-05, in
# the table on Hopper since): its CUDA tests first, then probe_mma.py PROBE_SET 16
# against the table (async, then WGMMA_SYNC=1 at Mixtral M = 64), logs in $OUT. Its
# PROBE_SET 17 runs (sync and async side by side, PROBE_ROUTES draws) were one call:
# bench/sweeps/probe_mma17_wgmma_h100.log. "ring": the warpgroup kernel with its words
# through a cp.async ring (probe_mma.py PROBE_SET 18 at Mixtral M = 16-256 and
# Qwen3-235B / Qwen3-30B-A3B M = 256, then its CUDA tests), logs in $OUT; "groups":
# its 2- and 4-step copy groups (PROBE_SET 19), logs in $OUT. "verify": what the
# 2026-12-06 session left unrun on a GPU (the PDL cases of Hopper's two decode forms,
# test_mma_options, DeepSeek-V3's row in the benchmark after the 64-pair cap:
# RESULTS.md of that model alone comes back in $OUT; keep bench/RESULTS.md whole).
# "table20": the verify mode's tests, then probe_mma.py PROBE_SET 20 (the table's
# warpgroup forms at 9-15 pairs an expert, Mixtral M = 36-60, and at 65-127 for
# experts below 2^25 weights: the Qwen3 models at M = 1280-1792, DeepSeek-V3 at
# 2560-3584), logs in $OUT. "small21": probe_mma.py PROBE_SET 21 (16-row warpgroup
# forms at 9-16 pairs an expert on all four models), logs in $OUT. "nreg23":
# PROBE_SET 23 (the 32-row gated w13 launched with maxnreg=128), logs in $OUT.
# "check22": PROBE_SET 20 at Mixtral M = 36-64 and DeepSeek-V3 M = 288 / 384 (the
# table's own choice there), then PROBE_SET 22, one log in $OUT. "w2wide24":
# PROBE_SET 24 (the warpgroup kernel's w2 in 128 x 128 tiles of 8 warps), logs in $OUT.
# "intdot": the benchmark (its RESULTS.md, results.json and charts copied to $OUT), then
# the GEMV's CUDA tests in nine jobs with the graph / sync tests and the module's, for
# the table with integer products (GemvTiles.int_dot), one log in $OUT.
# "wide": the benchmark (copied to $OUT), PROBE_SET=3 at M = 12-24 of the 128- and
# 256-expert models (the wide rule, GEMV_WIDE_GPUS), and the GEMV's model-shape tests.
# "rule": on an H200 the benchmark (copied to $OUT) and the integer GEMV's CUDA tests
# with the graph / sync ones; elsewhere bench/probe_int_dot.py PROBE_SET=3 (the decode
# rule: the table against its GEMV at M = 2-32, two routing draws) and
# test_triton_cuda.py in four jobs; logs in $OUT.
# "xring": the warpgroup kernel's input through its ring in logical K order
# (GemmTiles.x_shared): its CUDA tests, then probe_mma.py PROBE_SET 25, logs in $OUT;
# "xring2": the table with it (those tests, the warpgroup / PDL variants, the w4a16
# tests of test_triton_cuda.py in three jobs), then PROBE_SET 25 at M >= 512.
# "record": the benchmark (copied to $OUT), then the ring tests, the variants file's
# K-tail cases at per-row groups and the graph / sync tests, one log in $OUT.
# "ahead": on an H200 the benchmark (copied to $OUT); then bench/probe_int_dot.py
# PROBE_SET 6 (GemvTiles.inputs_ahead) at M = 1 and 4 on two routing draws; on other
# GPUs then the inputs_ahead GEMV tests with record's, one log in $OUT.
# "final": the benchmark (copied to $OUT), then the table GEMV's CUDA tests, the
# module's, the w4a16 graph / sync tests and the GEMV's float16-chain (bulk) and PTX
# tests in five jobs, one log in $OUT.
# "final-tests": those five jobs alone. "emul": bench/probe_emulation_gemv.py at
# M = 1-16 with PROBE_FORCE=1 (triton-emulation's 16-bit GEMV against its GEMM and the
# grouped_mm anchor, eager and replayed), log in $OUT; then the benchmark (copied too).
# "profile": on an H200 the benchmark first (bench.tar in $OUT: its log, RESULTS.md,
# results.json, charts), then on any GPU Nsight Compute (--set full) over one forward
# of each NCU_CELLS cell (default Mixtral M = 64 and Qwen3-235B M = 1): the report
# (gzipped), its details page and its SASS source page (CSV, gzipped) in $OUT.
# The device tool brings back at most eight files from $OUT; for modes that leave more
# (tests, final, emul), call it as: mkdir -p $OUT/t; OUT=$OUT/t bash bench/gpu_session.sh
# MODE; cd $OUT && tar czf t.tgz t && rm -rf t (how c91bab4's record and suite came back).
# Exit status: non-zero if the benchmark or any test job failed.
set -uo pipefail
out="${OUT:-/tmp}"
status=0
mode="${1:-all}"
probe_set() {  # set, log name, sizes, seconds, models: $out/probe_mma_set<set><name>.log
  local set=$1 name=$2 sizes=$3 limit=$4; shift 4
  PROBE_SET=$set PROBE_M=$sizes timeout "$limit" python bench/probe_mma.py "$@" \
    > "$out/probe_mma_set$set$name.log" 2>&1 || status=1
}
job_s=450  # a test job's seconds unless JOB_S says (modes below set their own)
run() {  # name, then pytest arguments: one test job, its log $out/cuda_<name>.log
  # (in $out, so a call cut off at the device's limit still brings the logs back)
  local name=$1; shift
  timeout "${JOB_S:-$job_s}" python -m pytest -q -p no:cacheprovider "$@" > "$out/cuda_$name.log" 2>&1 \
    || { echo "cuda job $name failed or timed out (status $?)" >> "$out/cuda_$name.log"; return 1; }
}
gather() {  # log, then job names: wait for the jobs, their logs into $out/<log>, a summary
  local log=$1; shift
  for job in $(jobs -p); do wait "$job" || status=1; done
  for name in "$@"; do echo "=== $name"; cat "$out/cuda_$name.log"; done > "$out/$log"
  grep -E "passed|failed|error" "$out/$log" | grep -v "^E " | tail -10
}
bench_out() {  # seconds: the benchmark, its RESULTS.md, results.json and charts copied to $out
  timeout "$1" python bench/bench_gpu.py > "$out/bench.log" 2>&1 || status=1
  tail -3 "$out/bench.log"
  cp bench/RESULTS.md bench/results.json bench/*.png "$out/"
}
if [ "$mode" = "bench-both" ]; then  # first with L2 flushed by a write, kept aside
  BENCH_FLUSH=write timeout 270 python bench/bench_gpu.py > "$out/bench_flush_write.log" 2>&1 || status=1
  cp bench/results.json "$out/results_flush_write.json"
  tail -1 "$out/bench_flush_write.log"
  mode=bench
fi
if [ "$mode" = "quick" ]; then  # what changed since the full suite, and the host-time probes
  quick() {  # name, then pytest arguments
    local name=$1; shift
    timeout 280 python -m pytest -q -p no:cacheprovider "$@" > "$out/quick_$name.log" 2>&1
  }
  quick modules tests/modules/test_int4_moe_cuda.py tests/backends/test_triton_route.py || status=1
  tail -n 3 "$out/quick_modules.log"
  timeout 100 python bench/probe_routing_sources.py > "$out/probe_routing_sources.log" 2>&1 || status=1
  timeout 150 python bench/probe_eager_host.py > "$out/probe_eager_host.log" 2>&1 || status=1
  quick bulk tests/backends/test_triton_gemv_cuda.py -k bulk &
  quick gemv tests/backends/test_triton_gemv_cuda.py -k "cuda_graph or model_shapes or pdl" &
  quick graphs tests/backends/test_triton_cuda.py -k "graph or sync" &
  for job in $(jobs -p); do wait "$job" || status=1; done
  tail -n 2 "$out"/quick_*.log
  exit $status
fi
if [ "$mode" = "wgmma" ]; then
  timeout 170 python -m pytest -q -p no:cacheprovider tests/backends/test_triton_gemm_variants_cuda.py \
    -k wgmma > "$out/wgmma_tests.log" 2>&1 || status=1
  tail -n 4 "$out/wgmma_tests.log"
  PROBE_SET=16 PROBE_M=16,64,256 timeout 240 python bench/probe_mma.py mixtral-8x7b deepseek-v3 \
    > "$out/probe_mma_set16a.log" 2>&1 || status=1
  PROBE_SET=16 PROBE_M=16,64 timeout 120 python bench/probe_mma.py qwen3-235b-a22b qwen3-30b-a3b \
    > "$out/probe_mma_set16b.log" 2>&1 || status=1
  WGMMA_SYNC=1 PROBE_SET=16 PROBE_M=64 timeout 60 python bench/probe_mma.py mixtral-8x7b \
    > "$out/probe_mma_set16_sync.log" 2>&1 || status=1
  grep -h "M=" "$out"/probe_mma_set16*.log | tail -80
  exit $status
fi
if [ "$mode" = "ring" ]; then  # the warpgroup kernel's words through a cp.async ring
  probe() { probe_set 18 "$@"; }  # log name, sizes, seconds, models
  PROBE_ROUTES=3 probe a 64 150 mixtral-8x7b
  probe b 16,128,256 90 mixtral-8x7b
  probe c 256 80 qwen3-235b-a22b qwen3-30b-a3b
  grep -h "M=" "$out"/probe_mma_set18*.log
  ring_tests() {  # name, then pytest arguments
    local name=$1; shift
    timeout 200 python -m pytest -q -p no:cacheprovider \
      tests/backends/test_triton_gemm_variants_cuda.py "$@" \
      > "$out/ring_tests_$name.log" 2>&1 || status=1
  }
  ring_tests bf16 -k "ring and wgmma and bfloat16" &
  ring_tests fp16 -k "ring and wgmma and float16 and not bfloat16" &
  ring_tests rest -k "k_not_a_multiple or table" &
  for job in $(jobs -p); do wait "$job" || status=1; done
  tail -n 2 "$out"/ring_tests_*.log
  exit $status
fi
if [ "$mode" = "verify" ]; then  # what 2026-12-06 left unrun on a GPU
  timeout 240 python -m pytest -q -p no:cacheprovider \
    tests/backends/test_triton_gemm_variants_cuda.py -k "pdl or mma_options" \
    > "$out/verify_tests.log" 2>&1 || status=1
  tail -n 3 "$out/verify_tests.log"
  timeout 240 python bench/bench_gpu.py deepseek-v3 > "$out/bench_deepseek_v3.log" 2>&1 \
    || status=1
  grep -E "M= (1024|4096)" "$out/bench_deepseek_v3.log"
  exit $status
fi
if [ "$mode" = "table20" ]; then  # unmeasured rows of the warpgroup kernel
  timeout 200 python -m pytest -q -p no:cacheprovider \
    tests/backends/test_triton_gemm_variants_cuda.py -k "pdl or mma_options" \
    > "$out/verify_tests.log" 2>&1 || status=1
  tail -n 3 "$out/verify_tests.log"
  probe() { probe_set 20 "$@"; }  # log name, sizes, seconds, models
  probe a 36,44,52,60 100 mixtral-8x7b
  probe b 1280,1536,1792 110 qwen3-235b-a22b qwen3-30b-a3b
  probe c 2560,3072,3584 110 deepseek-v3
  grep -h "M=" "$out"/probe_mma_set20*.log
  exit $status
fi
if [ "$mode" = "small21" ]; then  # 16-row warpgroup forms at 9-16 pairs an expert
  probe() { probe_set 21 "$@"; }  # log name, sizes, seconds, models
  PROBE_ROUTES=2 probe a 36,48,60,64 120 mixtral-8x7b
  probe b 144,192,240,256 120 qwen3-235b-a22b qwen3-30b-a3b
  probe c 288,384,480 100 deepseek-v3
  grep -h "M=" "$out"/probe_mma_set21*.log
  exit $status
fi
if [ "$mode" = "w2wide24" ]; then  # the warpgroup kernel's w2 in 128-row tiles
  probe() { probe_set 24 "$@"; }  # log name, sizes, seconds, models
  PROBE_ROUTES=2 probe a 36,48,64 100 mixtral-8x7b
  probe b 128,256,512 70 mixtral-8x7b
  probe c 256,512 80 qwen3-235b-a22b qwen3-30b-a3b
  probe d 288,512 80 deepseek-v3
  grep -h "M=\|FAIL" "$out"/probe_mma_set24*.log
  exit $status
fi
if [ "$mode" = "check22" ]; then  # the new table's rows, then PROBE_SET 22
  log="$out/probe_mma_set22.log"
  PROBE_SET=20 PROBE_M=36,48,64 timeout 100 python bench/probe_mma.py mixtral-8x7b \
    > "$log" 2>&1 || status=1
  PROBE_SET=20 PROBE_M=288,384 timeout 80 python bench/probe_mma.py deepseek-v3 \
    >> "$log" 2>&1 || status=1
  PROBE_SET=22 PROBE_ROUTES=2 PROBE_M=64 timeout 150 python bench/probe_mma.py \
    mixtral-8x7b >> "$log" 2>&1 || status=1
  PROBE_SET=22 PROBE_M=16,64 timeout 120 python bench/probe_mma.py deepseek-v3 \
    qwen3-235b-a22b >> "$log" 2>&1 || status=1
  grep "M=\|FAIL" "$log"
  exit $status
fi
if [ "$mode" = "nreg23" ]; then  # the 32-row gated w13 at 128 registers
  probe() { probe_set 23 "$@"; }  # log name, sizes, seconds, models
  PROBE_ROUTES=2 probe a 64 100 mixtral-8x7b
  probe b 128,256,512 90 mixtral-8x7b
  probe c 512,1024 90 qwen3-235b-a22b qwen3-30b-a3b
  probe d 1024 60 deepseek-v3
  grep -h "M=\|FAIL" "$out"/probe_mma_set23*.log
  exit $status
fi
if [ "$mode" = "groups" ]; then  # the warpgroup kernel's copy groups (PROBE_SET 19)
  probe() { probe_set 19 "$@"; }  # log name, sizes, seconds, models
  PROBE_ROUTES=2 probe a 64 70 mixtral-8x7b
  probe b 32,128,256,512 70 mixtral-8x7b
  probe c 256,512 80 qwen3-235b-a22b qwen3-30b-a3b
  probe d 512 60 deepseek-v3
  grep -h "M=" "$out"/probe_mma_set19*.log
  exit $status
fi
if [ "$mode" = "probes" ]; then
  probe() {  # set, sizes, log seconds, models
    local set=$1 sizes=$2 limit=$3; shift 3
    PROBE_SET=$set PROBE_M=$sizes timeout "$limit" python bench/probe_mma.py "$@" \
      > "$out/probe_mma_set$set.log" 2>&1 || status=1
    tail -4 "$out/probe_mma_set$set.log"
  }
  probe 13 4,16,64 240
  probe 14 32,64 150 mixtral-8x7b qwen3-235b-a22b
  probe 15 2,4,8 150 mixtral-8x7b qwen3-235b-a22b
  exit $status
fi
if [ "$mode" = "wide" ]; then  # the benchmark, the rule probe on the wide rule, its tests
  bench_out 250
  PROBE_SET=3 PROBE_M=12,16,24 PROBE_ROUTES=2 timeout 200 python bench/probe_int_dot.py \
    qwen3-30b-a3b qwen3-235b-a22b deepseek-v3 > "$out/probe_int_dot_set3_wide.log" 2>&1 || status=1
  timeout 280 python -m pytest -q -p no:cacheprovider tests/backends/test_triton_gemv_cuda.py \
    -k "model_shapes" > "$out/cuda_wide_rule.log" 2>&1 || status=1
  tail -2 "$out/cuda_wide_rule.log"
  exit $status
fi
if [ "$mode" = "rule" ]; then  # an H200: the benchmark; else the decode-rule probe and suites
  job_s=300
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    bench_out 250
    gemv=tests/backends/test_triton_gemv_cuda.py
    run i1 $gemv -k "intdot and not intdot_few and not magnitude" &
    run i2 $gemv -k "intdot_few or (intdot and magnitude)" &
    run i3 tests/backends/test_triton_cuda.py -k "graph or sync" &
    gather cuda_rule_call.log i1 i2 i3
  else
    PROBE_SET=3 PROBE_M=2,4,8,12,16,24,32 PROBE_ROUTES=2 timeout 330 python bench/probe_int_dot.py \
      > "$out/probe_int_dot_set3.log" 2>&1 || status=1
    tail -3 "$out/probe_int_dot_set3.log"
    cuda=tests/backends/test_triton_cuda.py
    run c1 $cuda -k "w4a16 and schemes_and_dtypes" &
    run c2 $cuda -k "w4a16 and not schemes_and_dtypes" &
    run c3 $cuda -k "not w4a16 and (schemes_and_dtypes or activations)" &
    run c4 $cuda -k "not w4a16 and not schemes_and_dtypes and not activations" &
    gather cuda_rule_call.log c1 c2 c3 c4
  fi
  exit $status
fi
if [ "$mode" = "intdot" ]; then  # the benchmark, then the GEMV suite and graph/sync tests
  bench_out 200
  job_s=330
  gemv=tests/backends/test_triton_gemv_cuda.py
  lv="not loop_variants"
  run g1 $gemv -k "bytes and $lv" &
  run g2 $gemv -k "words and $lv" &
  run g3 $gemv -k "paired and $lv" &
  run g4 $gemv -k "pdl and $lv" &
  run g5 $gemv -k "bulk and $lv" &
  run g6 $gemv -k "intdot and not intdot_few and $lv" &
  run g7 $gemv -k "intdot_few and $lv" &
  run g8 $gemv -k "loop_variants" &
  run g9 $gemv -k "not (bytes or words or paired or pdl or bulk or intdot) and $lv" &
  run graphs tests/backends/test_triton_cuda.py -k "graph or sync" &
  run modules tests/modules/test_int4_moe_cuda.py &
  gather cuda_intdot_suite.log g1 g2 g3 g4 g5 g6 g7 g8 g9 graphs modules
  exit $status
fi
if [ "$mode" = "xring" ]; then  # the warpgroup kernel's input ring: tests, PROBE_SET 25
  timeout 230 python -m pytest -q -p no:cacheprovider -x \
    tests/backends/test_triton_wgmma_ring_cuda.py > "$out/xring_tests.log" 2>&1 || status=1
  tail -n 3 "$out/xring_tests.log"
  probe() { probe_set 25 "$@"; }  # log name, sizes, seconds, models
  PROBE_ROUTES=2 probe a 36,64 110 mixtral-8x7b
  probe b 128,256 60 mixtral-8x7b
  probe c 64,256 80 qwen3-235b-a22b qwen3-30b-a3b
  probe d 288 50 deepseek-v3
  grep -h "M=\|FAIL" "$out"/probe_mma_set25*.log
  exit $status
fi
if [ "$mode" = "xring2" ]; then  # the table with the input ring: tests, PROBE_SET 25 above 256
  job_s=300
  run r1 tests/backends/test_triton_wgmma_ring_cuda.py &
  run r2 tests/backends/test_triton_gemm_variants_cuda.py -k "wgmma or pdl or hopper" &
  run r3 tests/backends/test_triton_cuda.py -k w4a16 &
  gather xring_suite.log r1 r2 r3
  probe() { probe_set 25 "$@"; }  # log name, sizes, seconds, models
  probe e 512 60 mixtral-8x7b
  probe f 512,1024 90 qwen3-235b-a22b
  probe g 512,1024,1536 90 qwen3-30b-a3b
  probe h 512,1024 120 deepseek-v3
  probe i 36,64 60 mixtral-8x7b
  grep -h "M=\|FAIL" "$out"/probe_mma_set25*.log
  exit $status
fi
if [ "$mode" = "record" ]; then  # the benchmark, then what 4510000 left unrun on a GPU
  bench_out 330
  job_s=230
  run q1 tests/backends/test_triton_wgmma_ring_cuda.py &
  run q2 tests/backends/test_triton_gemm_variants_cuda.py -k "k_not_a_multiple_of_32 and g-1-" &
  run q3 tests/backends/test_triton_cuda.py -k "graph or sync" &
  gather record_suite.log q1 q2 q3
  exit $status
fi
if [ "$mode" = "ahead" ]; then  # the GEMV's inputs a step ahead (PROBE_SET 6), tests
  h200=0
  nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && h200=1
  [ $h200 = 1 ] && bench_out 300
  PROBE_SET=6 PROBE_M=1,4 PROBE_ROUTES=2 timeout 200 python bench/probe_int_dot.py \
    > "$out/probe_int_dot_set6.log" 2>&1 || status=1
  grep -h "M=\|Error\|error" "$out/probe_int_dot_set6.log" | tail -80
  [ $h200 = 1 ] && exit $status
  job_s=210
  run a1 tests/backends/test_triton_gemv_cuda.py -k inputs_ahead &
  run a2 tests/backends/test_triton_wgmma_ring_cuda.py &
  run a3 tests/backends/test_triton_gemm_variants_cuda.py -k "k_not_a_multiple_of_32 and g-1-" &
  run a4 tests/backends/test_triton_cuda.py -k "graph or sync" &
  gather ahead_suite.log a1 a2 a3 a4
  exit $status
fi
if [ "$mode" = "emul" ]; then  # the emulation's GEMV against its GEMM, then the benchmark
  PROBE_M=1,2,4,8,16 PROBE_FORCE=1 timeout 200 python bench/probe_emulation_gemv.py \
    > "$out/probe_emulation_gemv.log" 2>&1 || status=1
  tail -3 "$out/probe_emulation_gemv.log"
  bench_out 300
  exit $status
fi
if [ "$mode" = "final" ] || [ "$mode" = "final-tests" ]; then  # bench; GEMV, module tests
  [ "$mode" = "final" ] && bench_out 300
  job_s=270
  run f1 tests/backends/test_triton_gemv_cuda.py \
    -k "intdot and not intdot_few and not intdot_at_step and not ptx and not magnitude" &
  run f2 tests/backends/test_triton_gemv_cuda.py \
    -k "inputs_ahead or (magnitude and intdot and not intdot_few)" &
  run f3 tests/modules/test_int4_moe_cuda.py &
  run f4 tests/backends/test_triton_cuda.py -k "w4a16 and (graph or sync)" &
  run f5 tests/backends/test_triton_gemv_cuda.py -k "bulk or ptx" &
  gather final_suite.log f1 f2 f3 f4 f5
  exit $status
fi
if [ "$mode" = "profile" ]; then  # an H200: the benchmark first; then Nsight Compute
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    timeout 330 python bench/bench_gpu.py > bench/bench.log 2>&1 || status=1
    tail -3 bench/bench.log
    tar cf "$out/bench.tar" bench/bench.log bench/RESULTS.md bench/results.json bench/*.png
  fi
  rep="$out/profile"
  NCU_CELLS="${NCU_CELLS:-mixtral-8x7b:64,qwen3-235b-a22b:1}" timeout 220 ncu \
    --clock-control none --profile-from-start off --set full -f -o "$rep" \
    python bench/probe_mma.py ncu > "$out/ncu_run.log" 2>&1 || status=1
  tail -3 "$out/ncu_run.log"
  ncu -i "$rep.ncu-rep" > "$out/ncu_details.txt" 2>&1 || status=1
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$out/ncu_sass.csv.gz"
  gzip "$rep.ncu-rep"
  ls -la "$out"
  exit $status
fi
if [ "$mode" != "tests" ]; then
  timeout 540 python bench/bench_gpu.py > "$out/bench.log" 2>&1 || status=1
  tail -3 "$out/bench.log"
fi
[ "$mode" = "bench" ] && exit $status
gemv="not word_tiles and not magnitude and not loop_variants and not bulk"
run gemv tests/backends/test_triton_gemv_cuda.py -k "$gemv and (bytes or words)" &
run gemv_pairs tests/backends/test_triton_gemv_cuda.py -k "$gemv and not bytes and not words" &
run gemv_loops tests/backends/test_triton_gemv_cuda.py -k loop_variants &
run gemv_words tests/backends/test_triton_gemv_cuda.py -k "(word_tiles or magnitude) and not bulk" &
run gemv_bulk tests/backends/test_triton_gemv_cuda.py -k bulk &
run dequant tests/backends/test_triton_dequant_cuda.py &
run w4a16 tests/backends/test_triton_cuda.py -k w4a16 &
run rest tests/backends/test_triton_cuda.py -k "not w4a16" &
run modules tests/modules/test_int4_moe_cuda.py tests/backends/test_triton_route.py &
run variants tests/backends/test_triton_gemm_variants_cuda.py &
gather cuda_tests.log gemv gemv_pairs gemv_loops gemv_words gemv_bulk dequant w4a16 rest \
  modules variants
exit $status
