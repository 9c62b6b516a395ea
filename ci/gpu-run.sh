#!/usr/bin/env bash
# turbo-llama: the whole GPU run in one go (H200 via the device tool, or any CUDA machine).
#   ci/gpu-run.sh [bg] [tlfull] [prebuilt] [build] [wait] [model] [test] [vquick] [ncu] [ktime] [d0graph] [combine] [pdl] [ropeq] [nwide] [setrows] [fatime] [mixed] [ablate] [ncu0] [gbench] [ppl] [cli] [kv] [bench]   (results in $OUT, default /tmp/gpu-out)
#   default: build test bench. The device tool keeps a machine (and /tmp) 30 s after a call, so a session:
#     call 1: `bg` (starts the build in the background from a copy of the repo)
#     calls 2..6: `model` (one part of the Gemma GGUF each: .devcarry/m1/p1 .. m6/p6, split so that a part plus
#     the repo stays under the 64 MiB a call carries)
#     then `wait model test ppl cli`, `kv bench` ...
#   bench runs (TL_BENCH, default main): main (TL_TYPES, may hold variants such as turbo3+TURBO_PDL=1; TL_ROUNDS: interleaved rounds of the types), deep (128K; TL_DEEP_ROUNDS), v3, mma8, mma9 (TURBO_FA_MMA), hf (TURBO_FA_HEADS_FIRST=1),
#   pre0 (TURBO_FA_PREFILL=0: the generic prefill conversion), nooff (TURBO_K_OFFSET=0), steps2.. (TURBO_FA_MIN_STEPS),
#   cl (TURBO_FA_CLUSTER=1), env:A=1,B=2 (any switches; turbo3 and turbo2 at TL_VAR_DEPTHS, default 0,8192)
#   vquick: FLASH_ATTN_EXT correctness and the decode perf cases (32K, 128K) of the default and of each TL_PERF_VARIANT
#   only: with `TL_TARGETS=test-backend-ops ... build vquick` one call of ~5 minutes tries a kernel variant (run 14).
#   (TL_FA_PERF: the perf cases' filter, e.g. with nb=(1|512) for patch 0014's prefill case too, run 15)
#   d0graph: depth-0 decode with and without CUDA graphs, f16 against turbo3 and q8_0 (run 15)
#   combine: the split merges alone, correctness and us per launch (cuda/host-check/combine_bench.cu; no build)
#   ablate: ncu times of the decode op's kernels for the timing variants TURBO_FA_MMA=30..41, 44 (TL_ABLATE, run 21)
#   pdl: TURBO_PDL=1's race check (perplexity logits, KLD 0) and decode speed (run 16)
#   ropeq: the same check for TURBO_FUSE_ROPE_Q (Q's RoPE in the attention kernel; run 17)
#   setrows: the KV write kernels (TURBO_SET_ROWS=0/1/4) give the same perplexity logits (run 22)
# .devcarry is not in git: on a fresh checkout make it first (a few minutes, on this CPU machine):
#   .venv/bin/turbo-llama prepare --out /tmp/prep && bash ci/make-devcarry.sh /tmp/prep --pristine
#   .venv/bin/python -m pip download --no-deps --only-binary :all: click tqdm -d .devcarry/whl
#   and carry .devcarry/tree.tar.gz, .devcarry/pristine.tar.gz (for bg/tlfull) and .devcarry/whl (for bench).
# Needs .devcarry/tree.tar.gz: the stripped upstream tree (b11312) with our overlay + patches applied
# (made by ci/make-devcarry.sh from the patched dev tree: git archive minus docs/ models/ media/, unused backends).
# The current cuda/ sources are copied over the tree's copies, so kernel fixes need no new tarball.
# Time guard: the benchmark stops starting new runs after ${TL_DEADLINE:-540} s.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${TL_WORK:-/tmp/tl}; TREE=$WORK/tree; BUILD=$WORK/build; B=$BUILD/bin
# the device tool returns at most 8 files from $OUT: logs go to a folder of their own, and $OUT gets
# summary.txt plus one logs.tgz when the call ends
FINAL_OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$FINAL_OUT"
OUT=$WORK/logs/$(date +%H%M%S)-$$; mkdir -p "$OUT"
finish() { cp "$OUT/summary.txt" "$FINAL_OUT/summary.txt" 2>/dev/null; tar czf "$FINAL_OUT/logs.tgz" -C "$OUT" . 2>/dev/null; }
trap finish EXIT
# a failed FA check of the default kernels in an earlier call of this machine leaves the settings that
# passed in $WORK/safe.env; the rest of the machine's runs use them
[ -f "$WORK/safe.env" ] && export $(cat "$WORK/safe.env")
DEADLINE=${TL_DEADLINE:-540}
FA_PERF=${TL_FA_PERF:-'hsk=128,hsv=128,nh=8,nr23=\[4,1\],kv=(32768|131072),nb=1,'}   # patch 0010's decode cases (0014's prefill: nb=512)
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el)s] $*" | tee -a "$OUT/summary.txt"; }
PHASES="${*:-build test bench}"

log "machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null) | $(nproc) cores | nvcc $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*') | $(date -u +%FT%TZ)"

# without tree.tar.gz, .devcarry/mini.tar.gz (gguf-py only, ci/make-devcarry.sh) serves the phases that only run
# prebuilt binaries and turbo-llama: then `prebuilt bench` fits one call (run 23: prebuilt + mini + whl < 64 MiB)
mkdir -p "$WORK"
if [ ! -f "$TREE/CMakeLists.txt" ] && [ -f "$REPO/.devcarry/tree.tar.gz" ]; then
    tar xzf "$REPO/.devcarry/tree.tar.gz" -C "$WORK" || { log "tree.tar.gz unreadable"; exit 1; }
elif [ ! -d "$TREE" ]; then
    if [ -f "$REPO/.devcarry/mini.tar.gz" ]; then
        tar xzf "$REPO/.devcarry/mini.tar.gz" -C "$WORK" || { log "mini.tar.gz unreadable"; exit 1; }
        log "mini tree (gguf-py only): no build phases in this call"
    else
        log "tarball missing: carry .devcarry/tree.tar.gz (or mini.tar.gz with prebuilt)"; exit 1
    fi
fi
while read -r src dst; do
    case "$src" in cuda/*) [ -d "$(dirname "$TREE/$dst")" ] && cp "$REPO/$src" "$TREE/$dst" ;; esac
done < "$REPO/patches/b11312/overlay"

if [[ " $PHASES " == *" bg "* ]]; then
    # the repo folder is laid anew each call: build from a copy, in a new session so that it outlives the call
    rm -rf "$WORK/repo" && mkdir -p "$WORK/repo" && tar -C "$REPO" --exclude=./.devcarry/m1 --exclude=./.devcarry/m2 \
        --exclude=./.devcarry/m3 --exclude=./.devcarry/m4 --exclude=./.devcarry/m5 --exclude=./.devcarry/m6 -cf - . | tar -C "$WORK/repo" -xf -
    rm -f "$WORK/build.done" "$WORK/build.fail"
    OUT="$WORK/bg-out" setsid nohup bash "$WORK/repo/ci/gpu-run.sh" ${TL_BG_BUILD:-tlfull} > "$WORK/bg.log" 2>&1 < /dev/null &
    log "background build (${TL_BG_BUILD:-tlfull}) started (pid $!)"
fi

# a spec "[ENV=VALUE[,ENV=VALUE]:]REST" (the phases that take specs): sets envset (empty when none) and rest
split_env_spec() { envset=""; rest=$1; case "$1" in *:*) envset=${1%%:*}; rest=${1#*:} ;; esac; }
# runs a command with the spec's switches (envset, comma-separated) in its environment
with_spec_env() { env $(echo "${envset:-TL_NONE=1}" | tr "," " ") "$@"; }

# the turbo-llama command on this machine: click and tqdm travel as wheels in .devcarry/whl
tl_python() {
    if [ ! -d /tmp/site/click ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$REPO"/.devcarry/whl/*.whl > /dev/null 2>&1 || log "wheel install failed"
    fi
    export PYTHONPATH=/tmp/site:$REPO/python:$TREE/gguf-py TURBO_LLAMA_DATA=$REPO PYTHONUNBUFFERED=1
}

# the text of the logits checks (pdl, ropeq, setrows, ...): this repo's own prose, in $TXT
ppl_text() { TXT=$WORK/pdl-text.txt; cat "$REPO"/README.md "$REPO"/results/*.md > "$TXT"; }

# M8: the random-weight llama8b GGUF (made once per machine by turbo-llama, cached under $WORK/cache); also sets up
# the turbo-llama command and TURBO_LLAMA_CACHE in this shell. $1 names the phase's error log
llama8b_model() {
    tl_python; export TURBO_LLAMA_CACHE=$WORK/cache
    M8=$(python3 -c "from turbo_llama.shapes import shape_gguf; from turbo_llama import model; print(shape_gguf('llama8b', model.cache_root()/'shapes'))" 2>> "$OUT/$1.err")
}

build_test_turbo_cuda() {
    g++ -O2 -std=c++17 "$REPO/cuda/test-turbo-cuda.cpp" -I"$TREE/ggml/include" -L"$B" -lggml -lggml-base -lggml-cpu -lggml-cuda \
        -Wl,-rpath,"$B" -o "$B/test-turbo-cuda" >> "$OUT/build.log" 2>&1 || log "test-turbo-cuda build failed"
}

if [[ " $PHASES " == *" tlfull "* ]]; then
    # issue #4: every binary of this run comes from the product's own `turbo-llama build --cuda`, fed the pinned
    # pristine tree (.devcarry/pristine.tar.gz, ci/make-devcarry.sh --pristine; hash-checked by prepare), shared
    # libraries so that test-turbo-cuda can link ggml; the plain cmake build of the prepared tree is the fallback
    tl_python
    if ! command -v git > /dev/null; then
        log "no git on this machine: turbo-llama prepare needs it; falling back to the cmake build"; PHASES="$PHASES build"
    elif ! { rm -rf "$WORK/pristine" && mkdir -p "$WORK/pristine" && tar xzf "$REPO/.devcarry/pristine.tar.gz" -C "$WORK/pristine"; }; then
        log "no .devcarry/pristine.tar.gz: falling back to the cmake build"; PHASES="$PHASES build"
    else
        log "turbo-llama build --cuda --cuda-arch 90 --llama-src pristine --build-dir build --cmake-arg -DBUILD_SHARED_LIBS=ON"
        TURBO_LLAMA_CACHE=$WORK/tlcache python3 -m turbo_llama build --cuda --cuda-arch 90 --llama-src "$WORK/pristine" \
            --build-dir "$BUILD" --prefix "$WORK/tlprefix" --cmake-arg -DBUILD_SHARED_LIBS=ON > "$OUT/tlbuild.log" 2>&1
        rc=$?
        log "turbo-llama build --cuda: rc=$rc | $(grep -E 'compile/link step|install\]' "$OUT/tlbuild.log" | tr '\n' ' ' | head -c 300)"
        if [ "$rc" = 0 ]; then
            cp "$OUT/tlbuild.log" "$OUT/build.log"; build_test_turbo_cuda; touch "$WORK/build.done"
        else
            tail -30 "$OUT/tlbuild.log" >> "$OUT/summary.txt"; log "falling back to the cmake build"; PHASES="$PHASES build"
        fi
    fi
fi

# prebuilt: binaries and shared libraries built elsewhere (.devcarry/prebuilt.tar.gz: bin/ of a CUDA build for sm_90,
# made on the CPU machine by ci/make-prebuilt.sh, when the device time left is less than a build's), unpacked
# into $B; they find their libraries through LD_LIBRARY_PATH, set in every later call of this machine as well
if [[ " $PHASES " == *" prebuilt "* ]]; then
    mkdir -p "$BUILD" && tar xzf "$REPO/.devcarry/prebuilt.tar.gz" -C "$BUILD" && touch "$B/.prebuilt" "$WORK/build.done" \
        && log "prebuilt binaries: $(ls "$B" | tr '\n' ' ')" || log "prebuilt: no .devcarry/prebuilt.tar.gz"
fi
[ -f "$B/.prebuilt" ] && export LD_LIBRARY_PATH="$B:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [[ " $PHASES " == *" build "* ]]; then
    log "configure + build"
    cmake -S "$TREE" -B "$BUILD" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DGGML_RPC=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=ON \
        -DLLAMA_BUILD_APP=OFF > "$OUT/build.log" 2>&1 || { log "cmake failed"; tail -30 "$OUT/build.log"; touch "$WORK/build.fail"; exit 1; }
    # TL_TARGETS: a smaller set when only the kernels are measured (test-backend-ops llama-bench)
    ninja -C "$BUILD" -j"$(nproc)" ${TL_TARGETS:-test-backend-ops llama-bench llama-perplexity llama-completion llama-cli \
        llama-server llama-tokenize ggml-rpc-server} >> "$OUT/build.log" 2>&1 \
        || { log "build failed"; grep -B2 -A12 "error" "$OUT/build.log" | head -80; touch "$WORK/build.fail"; exit 1; }
    log "build ok"
    build_test_turbo_cuda
    touch "$WORK/build.done"
fi

if [[ " $PHASES " == *" wait "* ]]; then
    while [ ! -f "$WORK/build.done" ] && [ ! -f "$WORK/build.fail" ]; do sleep 2; done
    cat "$WORK/bg-out/summary.txt" >> "$OUT/summary.txt" 2>/dev/null; cp "$WORK/bg-out/build.log" "$OUT/" 2>/dev/null
    [ -f "$WORK/build.fail" ] && { log "background build FAILED"; tail -40 "$WORK/bg.log"; grep -B2 -A12 "error" "$WORK/bg-out/build.log" | head -60; exit 1; }
    log "background build finished"
fi

GEMMA=$WORK/gemma.gguf
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 GEMMA_BYTES=253113024
if [[ " $PHASES " == *" model "* ]]; then
    # the 241 MiB model travels in parts (one per call, 64 MiB limit); assembled and sha-checked once all are here
    mkdir -p "$WORK/parts"; for f in "$REPO"/.devcarry/m*/p*; do [ -f "$f" ] && cp "$f" "$WORK/parts/"; done
    log "model parts here: $(ls "$WORK/parts" | tr '\n' ' ')"
    # any number of parts p1..p9 (a part plus the repo must stay under the 64 MiB a call carries): assembled
    # in order once their sizes add up to the model's
    parts=$(ls "$WORK"/parts/p[1-9] 2>/dev/null | sort -V)
    if [ ! -f "$GEMMA" ] && [ -n "$parts" ] && [ "$(cat $parts | wc -c)" = "$GEMMA_BYTES" ]; then
        cat $parts > "$GEMMA.tmp"
        if [ "$(sha256sum "$GEMMA.tmp" | cut -d' ' -f1)" = "$GEMMA_SHA" ]; then mv "$GEMMA.tmp" "$GEMMA"; log "gemma assembled, sha256 ok"; else log "gemma sha256 MISMATCH"; fi
    fi
fi

if [[ " $PHASES " == *" test "* ]]; then
    log "bit-exactness of the CUDA write path"
    "$B/test-turbo-cuda" > "$OUT/bitexact.log" 2>&1; log "test-turbo-cuda rc=$?"
    grep "BITEXACT" "$OUT/bitexact.log" | tee -a "$OUT/summary.txt"
    # the default write kernel of test-turbo-cuda's 4096 blocks is the 2-thread one (run 22); TURBO_SET_ROWS=1 is the
    # warp one, =4 the 4-thread one
    for bv in ${TL_BITEXACT_VARIANTS-TURBO_SET_ROWS=1 TURBO_SET_ROWS=4}; do
        env $bv "$B/test-turbo-cuda" > "$OUT/bitexact-$bv.log" 2>&1; log "$bv test-turbo-cuda rc=$?"
        grep "BITEXACT" "$OUT/bitexact-$bv.log" | tee -a "$OUT/summary.txt"
    done
    : > "$OUT/tbo.log"
    # CPY turbo -> f16 is left out: the CPU reference (ggml-cpu dup) aborts on quantized -> f16 (lead's side)
    # spec: [ENV=VALUE:]OP|FILTER; the default kernel first, then the other variants on the pairs they serve
    for spec in "SET_ROWS|turbo" "SUB_SET_ROWS|turbo" "CPY|type_dst=turbo|type_src=turbo[23],type_dst=f32" "GET_ROWS|turbo" \
                "FLASH_ATTN_EXT|turbo" "ROPE_FLASH_ATTN|turbo" ${TL_FA_VARIANTS:-"TURBO_FUSE_ROPE_Q=0:ROPE_FLASH_ATTN|turbo" "TURBO_ROPE_Q_ONCE=0:ROPE_FLASH_ATTN|turbo" "TURBO_SET_ROWS=4:SET_ROWS|turbo" "TURBO_SET_ROWS=4:SUB_SET_ROWS|turbo" "TURBO_SET_ROWS=2:SET_ROWS|turbo" "TURBO_SET_ROWS=2:SUB_SET_ROWS|turbo" "TURBO_FA_MMA=8:FLASH_ATTN_EXT|type_K=turbo[23],type_V=turbo[23]" "TURBO_FA_MMA=9:FLASH_ATTN_EXT|type_K=turbo[23],type_V=turbo[23]" "TURBO_FA_MMA=13:FLASH_ATTN_EXT|type_K=turbo[23],type_V=turbo[23]" "TURBO_FA_PREFILL=0:FLASH_ATTN_EXT|turbo"}; do
        split_env_spec "$spec"; op=${rest%%|*}; filt=${rest#*|}
        echo "=== ${envset:+$envset }test-backend-ops -b CUDA0 -o $op -p '$filt'" >> "$OUT/tbo.log"
        with_spec_env "$B/test-backend-ops" -b CUDA0 -o $op -p "$filt" > "$WORK/tbo_one.log" 2>&1
        rc=$?; cat "$WORK/tbo_one.log" >> "$OUT/tbo.log"
        log "${envset:+$envset }test-backend-ops -b CUDA0 -o $op -p '$filt': rc=$rc | $(grep -E 'tests passed' "$WORK/tbo_one.log" | tail -1) | FAIL lines: $(grep -c FAIL "$WORK/tbo_one.log")"
        if [ "$op" = FLASH_ATTN_EXT ] && [ -z "$envset" ] && [ "$rc" != 0 ] && [ ! -f "$WORK/safe.env" ]; then
            grep -E "FAIL" "$WORK/tbo_one.log" | head -20 >> "$OUT/summary.txt"
            for safe in "TURBO_FA_MMA=8" "TURBO_FA_PREFILL=0 TURBO_FA_MMA=8" "TURBO_FA_PREFILL=0 TURBO_FA_V3=1"; do
                env $safe "$B/test-backend-ops" -b CUDA0 -o FLASH_ATTN_EXT -p "$filt" > "$WORK/tbo_safe.log" 2>&1
                r2=$?; log "default FA FAILED; with $safe: rc=$r2 | $(grep -E 'tests passed' "$WORK/tbo_safe.log" | tail -1)"
                if [ "$r2" = 0 ]; then echo "$safe" > "$WORK/safe.env"; export $safe; break; fi
            done
        fi
    done
    if [ -n "${TL_PERF-1}" ]; then   # TL_PERF= (empty) leaves the perf cases out
        # the KV write per cache type and a plain copy of the same f32 rows (patch 0010's perf cases)
        "$B/test-backend-ops" perf -b CUDA0 -o SET_ROWS > "$OUT/perf.log" 2>&1
        "$B/test-backend-ops" perf -b CUDA0 -o CPY >> "$OUT/perf.log" 2>&1
        "$B/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT -p "$FA_PERF" >> "$OUT/perf.log" 2>&1
        # other kernel variants on the same turbo cases, for the per-version notes (TL_PERF_VARIANT="TURBO_FA_MMA=8 TURBO_SET_ROWS=1")
        for pv in ${TL_PERF_VARIANT:-}; do
            echo "=== $pv" >> "$OUT/perf.log"
            env $pv "$B/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT -p "$FA_PERF.*type_K=turbo" >> "$OUT/perf.log" 2>&1
            env $pv "$B/test-backend-ops" perf -b CUDA0 -o SET_ROWS -p "type_dst=turbo" >> "$OUT/perf.log" 2>&1
        done
        # in file order: the write cases (GB/s), the decode cases (us/run), each variant after its === line
        sed 's/\x1b\[[0-9;]*m//g' "$OUT/perf.log" \
            | grep -E "((ne=|ne_src=)\[1024,4096,1,1\].*GB/s)|(FLASH_ATTN_EXT.*nh=8,nr23=\[4,1\].*us/run)|^=== " \
            | sed -E 's/max_bias=.*type_K=/type_K=/; s/,permute=[^)]*//' >> "$OUT/summary.txt"
    fi
    grep -E "FAIL|not supported" "$OUT/tbo.log" | head -40 >> "$OUT/summary.txt"
fi

if [[ " $PHASES " == *" vquick "* ]]; then
    for pv in TL_DEFAULT=1 ${TL_PERF_VARIANT:-}; do   # TL_DEFAULT=1: the default kernels; A=1,B=2: two switches
        case "$pv" in
        *TURBO_FA_MMA=3[0-9]*|*TURBO_FA_MMA=4[014]*) log "$pv: a timing variant (wrong results by design), no correctness check" ;;
        *)
            env $(echo "$pv" | tr , ' ') "$B/test-backend-ops" -b CUDA0 -o FLASH_ATTN_EXT -p "type_K=turbo[23],type_V=turbo[23]" > "$WORK/tbo_one.log" 2>&1
            log "$pv FLASH_ATTN_EXT turbo/turbo: rc=$? | $(grep -E 'tests passed' "$WORK/tbo_one.log" | tail -1)" ;;
        esac
        env $(echo "$pv" | tr , ' ') "$B/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT -p "$FA_PERF.*type_K=turbo" 2>&1 \
            | sed 's/\x1b\[[0-9;]*m//g' | grep -oE "kv=[0-9]+.*type_V=turbo[23].*us/run" \
            | sed -E 's/,nb=1,mask=1,sinks=0//; s/\): +[0-9]+ runs - +/ /' | sed "s/^/  $pv /" | tee -a "$OUT/summary.txt"
    done
fi

if [[ " $PHASES " == *" ncu "* ]]; then
    # hardware counters of one decode call (patch 0010's perf case) per kernel: stall reasons, bytes, occupancy
    if command -v ncu > /dev/null; then
        # spec TYPE:KV:KERNEL (the decode case), or OP:FILTER:KERNEL for another perf case (e.g.
        # "SET_ROWS:type_dst=turbo3,.*r=4096:k_turbo_set_rows", the bulk KV write)
        for spec in ${TL_NCU:-"turbo3:131072:k_turbo_fattn_mma" "f16:131072:flash_attn" "turbo3:32768:k_turbo_fattn_mma"}; do
            IFS=: read -r ty kv kern <<< "$spec"
            op=FLASH_ATTN_EXT; filt="nh=8,nr23=\[4,1\],kv=$kv,nb=1,.*type_K=$ty,type_V=$ty"
            case "$ty" in [A-Z]*) op=$ty; filt=$kv; kv=${kern} ;; esac
            f="$OUT/ncu-$ty-${kv//[^A-Za-z0-9_]/_}.txt"
            # plus the stall reasons per issued instruction and every pipe's utilisation (not printed by --set full)
            timeout ${TL_NCU_TIMEOUT:-150} ncu --clock-control none --set full -k "regex:$kern" -c 1 \
                --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__(inst_executed_pipe|pipe)_.*\.avg\.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum" \
                "$B/test-backend-ops" perf -b CUDA0 -o $op -p "$filt" > "$f" 2>&1
            log "ncu $ty kv=$kv ($kern): rc=$? | $(grep -E '^ +(Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per Thread) ' "$f" | tr -s ' ' | tr '\n' ';' | head -c 400)"
        done
    else
        log "no ncu here"
    fi
fi

if [[ " $PHASES " == *" ktime "* ]]; then
    # issue #6: where a decode step's time goes, per kernel: ncu times every launch of a few depth-0 decode steps
    # (llama-bench -p 0 -n N, CUDA graphs off so that each launch is its own kernel), ci/ktime.py sums them by name
    if [ "${TL_KTIME_MODEL:-}" = gemma ]; then   # needs the model phase's GGUF
        KM=$GEMMA; KNAME=gemma3-270m
    else
        llama8b_model ktime; KM=$M8; KNAME=llama8b
    fi
    NTOK=${TL_KTIME_N:-8}
    for spec in ${TL_KTIME:-f16 turbo3 q8_0}; do
        split_env_spec "$spec"; t=$rest
        f="$OUT/ktime-${envset:+${envset//[=:]/-}-}$t.csv"
        with_spec_env GGML_CUDA_DISABLE_GRAPHS=1 timeout ${TL_KTIME_TIMEOUT:-150} ncu --clock-control none --cache-control none \
            --metrics gpu__time_duration.sum --csv --print-units base \
            "$B/llama-bench" -m "$KM" -p 0 -n "$NTOK" -r 1 -fa 1 -ngl 99 -ctk $t -ctv $t --no-warmup > "$f" 2> "$f.err"
        log "ktime ${envset:+$envset }$t ($KNAME, d0, $NTOK tokens + the k-offset probe for turbo): rc=$?"
        python3 "$REPO/ci/ktime.py" "$f" "$NTOK" 2>&1 | head -${TL_KTIME_LINES:-16} | tee -a "$OUT/summary.txt"
    done
fi

if [[ " $PHASES " == *" d0graph "* ]]; then
    # issue #6, depth 0: the token-time gap to f16 (bench) is about twice the kernel-time gap (ktime); decode with
    # and without CUDA graphs tells whether the rest is on the host side (llama-bench -p 0 -n 128, llama8b shape)
    llama8b_model d0graph
    log "nsys: $(command -v nsys || echo none)"
    for g in on off; do   # upstream tests whether GGML_CUDA_DISABLE_GRAPHS is set, not its value
        for t in ${TL_D0_TYPES:-f16 turbo3 q8_0}; do
            env $([ $g = off ] && echo GGML_CUDA_DISABLE_GRAPHS=1) "$B/llama-bench" -m "$M8" -p 0 -n 128 -r 3 -fa 1 -ngl 99 -ctk $t -ctv $t -o md > "$OUT/d0graph-$t-$g.md" 2>&1
            log "d0 graphs $g, $t: $(grep -E '\| +tg128' "$OUT/d0graph-$t-$g.md" | tr -s ' ' | head -c 200)"
        done
    done
fi

if [[ " $PHASES " == *" combine "* ]]; then
    # the decode split merges alone (cuda/host-check/combine_bench.cu): errors against a double merge, and us per
    # launch of the default merge and of TURBO_FA_COMBINE=2's at 1..128 splits (no llama.cpp build needed: ~20 s)
    bash "$REPO/cuda/host-check/combine_bench.sh" "$TREE" 90 > "$OUT/combine.log" 2>&1
    log "combine_bench: rc=$?"; tail -16 "$OUT/combine.log" | tee -a "$OUT/summary.txt"
fi

# a decode-path switch's check ($1, e.g. TURBO_PDL; $2 names the phase's files): llama-perplexity on the llama8b random
# model (byte-level text), $1=0 twice (the noise floor: 0 if the path is deterministic) and $1=1 against the first
# run's logits; -ub 1 sends every token through the decode kernels, -ub 512 through the prefill path and the 4-thread
# KV write. -lv 4: llama's log shows ggml's INFO lines (such as the fused RoPE's, counted by $4) only from verbosity 4
# (run 18 counted 0 without it). Then llama-bench decode at TL_PDL_DEPTHS for f16, turbo3 and the specs in $3
# ([ENV=VALUE:]TYPE)
# SC_MODEL: another GGUF than the llama8b one (e.g. Gemma's, for switches of 256-wide heads); SC_DEPTHS: the bench's -d
switch_check() {
    local sw=$1 ph=$2 ub run v kl base spec t f
    llama8b_model $ph; [ -n "${SC_MODEL:-}" ] && M8=$SC_MODEL
    ppl_text
    for ub in 1 512; do
        base=$WORK/$ph-base-$ub.bin
        for run in base0 again0 on1; do
            v=${run: -1}; kl="--kl-divergence-base $base"; [ $run != base0 ] && kl="$kl --kl-divergence"
            env $sw=$v "$B/llama-perplexity" -m "$M8" -f "$TXT" -c 512 --chunks 2 -b 512 -ub $ub -fa on -ctk turbo3 -ctv turbo3 \
                -ngl 99 -lv 4 $kl > "$OUT/$ph-ppl-ub$ub-$run.log" 2>&1
            log "$ph check -ub $ub $run ($sw=$v): rc=$? | $(grep -E '^Mean +KLD|^Maximum KLD|^Same top p|Final estimate' "$OUT/$ph-ppl-ub$ub-$run.log" | tr -s ' ' | tr '\n' ';')${4:+ | $4: $(grep -c "$4" "$OUT/$ph-ppl-ub$ub-$run.log") log lines}"
        done
    done
    for spec in f16 $sw=0:turbo3 $sw=1:turbo3 $3; do
        split_env_spec "$spec"; t=$rest; f="$OUT/$ph-bench-${envset:+${envset//[=:]/-}-}$t.md"
        with_spec_env "$B/llama-bench" -m "$M8" -p 0 -n 128 -d ${SC_DEPTHS:-${TL_PDL_DEPTHS:-0,32768}} -r 2 -fa 1 -ngl 99 -ctk $t -ctv $t -o md > "$f" 2>&1
        log "$ph bench ${envset:+$envset }$t: $(grep -E '\| +tg128' "$f" | tr -s ' ' | sed -E 's/.*(tg128[^|]*)\| +([0-9.]+ ± [0-9.]+) \|/\1 \2/' | tr '\n' ';')"
    done
}

# TURBO_PDL=1 (programmatic dependent launch of the decode path's kernels, cuda/turbo.cuh; run 16: every KLD 0), with
# upstream's own PDL off (GGML_CUDA_PDL=0) as well; TL_PDL_SPECS: other bench specs, e.g. the unfused Q RoPE with and
# without TURBO_PDL ("TURBO_FUSE_ROPE_Q=0:turbo3 TURBO_FUSE_ROPE_Q=0,TURBO_PDL=1:turbo3": run 18 saw 237.6 against 255.0
# t/s at 32K for the latter against the fused default, with nothing to compare it with in the same call)
if [[ " $PHASES " == *" pdl "* ]]; then
    switch_check TURBO_PDL pdl "${TL_PDL_SPECS:-GGML_CUDA_PDL=0:f16 GGML_CUDA_PDL=0:turbo3}"
fi

# TURBO_FUSE_ROPE_Q (Q's RoPE inside the decode attention kernel, patches 0020-0021; the default since run 17): the
# logits may differ in the last bits (another kernel computes the same RoPE), so the check is a KLD at the noise floor
if [[ " $PHASES " == *" ropeq "* ]]; then
    # the fourth argument: a log line that says the switch took effect (run 17's first check passed without it)
    switch_check TURBO_FUSE_ROPE_Q ropeq "" "Q's RoPE done by the decode attention kernel"
fi

# TURBO_ROPE_NEOX_WIDE=1 (the fused RoPEs of 256-wide neox heads, K write and decode Q): Gemma 3 270M, whose heads
# are such (needs the model phase's GGUF)
if [[ " $PHASES " == *" nwide "* ]]; then
    SC_MODEL=$GEMMA SC_DEPTHS=${TL_NWIDE_DEPTHS:-0,8192} switch_check TURBO_ROPE_NEOX_WIDE nwide "${TL_NWIDE_SPECS:-q8_0}" \
        "Q's RoPE done by the decode attention kernel"
fi

if [[ " $PHASES " == *" setrows "* ]]; then
    # the KV write kernels against each other in a model's own graphs: llama-perplexity logits of the llama8b random
    # model with -ub 512 (4096-block writes: the 2-thread kernel by default since run 22) against TURBO_SET_ROWS=1
    # (the warp kernel) and =4 (4 threads): bit-exact writes give the noise floor of the logits file (the default run
    # twice) and nothing more
    llama8b_model setrows
    ppl_text
    for t in turbo3 turbo2; do
        base=$WORK/setrows-base-$t.bin; rm -f "$base"
        for v in 0 0 1 4; do
            kl="--kl-divergence-base $base"; [ -f "$base" ] && kl="$kl --kl-divergence"
            TURBO_SET_ROWS=$v "$B/llama-perplexity" -m "$M8" -f "$TXT" -c 512 --chunks 4 -b 512 -ub 512 -fa on -ctk $t -ctv $t \
                -ngl 99 $kl > "$OUT/setrows-$t-$v.log" 2>&1
            log "setrows $t TURBO_SET_ROWS=$v: rc=$? | $(grep -E '^Mean +KLD|^Maximum KLD|^Same top p|Final estimate' "$OUT/setrows-$t-$v.log" | tr -s ' ' | tr '\n' ';')"
        done
    done
fi

if [[ " $PHASES " == *" fatime "* ]]; then
    # kernel times of test-backend-ops perf cases (patches 0010, 0014): TL_FATIME specs [ENV=VALUE:]TYPE/KV/NB, e.g.
    # turbo3/32768/512 (one prefill ubatch: the conversion of a quantized cache and the attention, separate kernels)
    for spec in ${TL_FATIME:-f16/32768/512 q8_0/32768/512 turbo3/32768/512 turbo2/32768/512}; do
        split_env_spec "$spec"; IFS=/ read -r ty kv nb <<< "$rest"
        f="$OUT/fatime-${envset:+${envset//[=:]/-}-}$ty-$kv-$nb.csv"
        with_spec_env timeout ${TL_FATIME_TIMEOUT:-120} ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base -c ${TL_FATIME_N:-40} \
            "$B/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT -p "hsk=128,hsv=128,nh=8,nr23=\[4,1\],kv=$kv,nb=$nb,.*type_K=$ty,type_V=$ty" > "$f" 2>&1
        log "fatime ${envset:+$envset }$ty kv=$kv nb=$nb: rc=$? (per kernel: launches in the first ${TL_FATIME_N:-40} and mean us)"
        python3 "$REPO/ci/ktime.py" "$f" 1 2>&1 | head -8 | tee -a "$OUT/summary.txt"
    done
fi

if [[ " $PHASES " == *" mixed "* ]]; then
    # decode speed of mixed K/V pairs (the scalar turbo kernel serves them; the tensor-core one needs turbo K and V)
    llama8b_model mixed
    cmd="llama-bench -m random-llama8b -fa 1 -ngl 99 -p 0 -n 64 -r 2 -d ${TL_MIXED_DEPTHS:-0,32768} -ctk f16,q8_0,turbo3 -ctv f16,q8_0,turbo3 -o md"
    echo "$cmd" > "$OUT/mixed.md"
    timeout ${TL_MIXED_TIMEOUT:-400} "$B/llama-bench" -m "$M8" -fa 1 -ngl 99 -p 0 -n 64 -r 2 -d ${TL_MIXED_DEPTHS:-0,32768} \
        -ctk f16,q8_0,turbo3 -ctv f16,q8_0,turbo3 -o md >> "$OUT/mixed.md" 2>> "$OUT/mixed.err"
    log "mixed pairs: rc=$? ($cmd)"; grep -E "^\|" "$OUT/mixed.md" >> "$OUT/summary.txt"
fi

if [[ " $PHASES " == *" ablate "* ]]; then
    # the timing variants (TURBO_FA_MMA=30..41, 44: v14 with a stage of the loop left out, run 21): each kernel of the
    # decode op (patch 0010's perf case, turbo3) timed by ncu, with its executed instructions and issue use
    if command -v ncu > /dev/null; then
        for v in ${TL_ABLATE:-30 31 32 33 34 35}; do
            for kv in ${TL_ABLATE_KV:-32768 131072}; do
                f="$OUT/ablate-$v-$kv.txt"
                TURBO_FA_MMA=$v timeout ${TL_NCU_TIMEOUT:-150} ncu --clock-control none -k "regex:k_turbo_fattn" -c 2 \
                    --metrics gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__warps_active.avg.per_cycle_active \
                    "$B/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT -p "nh=8,nr23=\[4,1\],kv=$kv,nb=1,.*type_K=turbo3,type_V=turbo3" > "$f" 2>&1
                log "ablate TURBO_FA_MMA=$v kv=$kv: rc=$? | $(grep -E '^ +k_turbo|^  k_turbo|gpu__time_duration|smsp__inst_executed.sum|issue_active|dram__throughput|warps_active' "$f" | sed -E 's/\(.*//' | tr -s ' ' | tr '\n' ';' | head -c 600)"
            done
        done
    else
        log "no ncu here"
    fi
fi

if [[ " $PHASES " == *" ncu0 "* ]]; then
    # hardware counters of the turbo attention kernel at short context: one launch of a llama-bench decode on the
    # random llama8b-shaped GGUF, after TL_NCU0_SKIP launches of it (the probe and the first tokens)
    llama8b_model ncu0
    for t in ${TL_NCU0:-turbo3}; do
        f="$OUT/ncu0-$t.txt"
        GGML_CUDA_DISABLE_GRAPHS=1 timeout ${TL_NCU_TIMEOUT:-150} ncu --clock-control none --set full -k "regex:${TL_NCU0_KERNEL:-k_turbo_fattn_mma}" \
            --launch-skip ${TL_NCU0_SKIP:-300} -c 1 "$B/llama-bench" -m "$M8" -p 0 -n 16 -r 1 -fa 1 -ngl 99 -ctk $t -ctv $t --no-warmup > "$f" 2>&1
        log "ncu0 $t: rc=$? | $(grep -E '^ +(Duration|Grid Size|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|Executed Ipc Active) ' "$f" | tr -s ' ' | tr '\n' ';' | head -c 400)"
    done
fi

if [[ " $PHASES " == *" gbench "* ]]; then
    # Gemma 3 270M decode, f16 against turbo3 with and without patch 0007's gains (0012 computes them once);
    # TL_GBENCH_SPECS: [ENV=VALUE[,ENV=VALUE]:]TYPE each, TL_GBENCH_DEPTHS: llama-bench -d
    for spec in ${TL_GBENCH_SPECS:-f16 turbo3 TURBO_K_RESCALE=0:turbo3 q8_0}; do
        split_env_spec "$spec"; t=$rest; f="$OUT/gbench-${envset:+${envset//[=:,]/-}-}$t.md"
        with_spec_env "$B/llama-bench" -m "$GEMMA" -p 0 -n 128 -d ${TL_GBENCH_DEPTHS:-0} -r 3 -fa 1 -ngl 99 -ctk $t -ctv $t -o md > "$f" 2>&1
        log "gemma llama-bench -p 0 -n 128 -d ${TL_GBENCH_DEPTHS:-0} -r 3 -fa 1 -ngl 99 -ctk $t -ctv $t ${envset:+($envset)}: $(grep -E '\| +tg128' "$f" | tr -s ' ' | sed -E 's/.*(tg128[^|]*)\| +([0-9.]+ ± [0-9.]+) \|/\1 \2/' | tr '\n' ';')"
    done
fi

if [[ " $PHASES " == *" ppl "* ]]; then
    # same text cut and settings as the CPU quick eval (results/eval-quick), each backend against its own f16 run
    TXTN=${TL_PPL_TEXT:-text}; TXT=$REPO/.devcarry/$TXTN.txt; NCH=${TL_PPL_CHUNKS:-4}
    # TL_PPL_TYPES: [ENV=VALUE[,ENV=VALUE]:]TYPE each (f16 first: the others' KLD base)
    for spec in ${TL_PPL_TYPES:-f16 q8_0 q4_0 turbo3 turbo2}; do
        split_env_spec "$spec"; t=$rest; f="$OUT/ppl-${envset:+${envset//[=:,]/-}-}$t.log"
        kl="--kl-divergence-base $WORK/f16-logits-$TXTN-$NCH.bin"; [ "$t" != f16 ] && kl="$kl --kl-divergence"
        # TL_PPL_ARGS: more options for every type, e.g. `-ub 1` (every token a decode step: the decode kernels)
        cmd="${envset:+$envset }llama-perplexity -m gemma-3-270m-q4_k_m.gguf -f $TXTN.txt -c 2048 --chunks $NCH -fa on -ctk $t -ctv $t -lv 4 -ngl 99 ${TL_PPL_ARGS:-} $kl"
        echo "=== $cmd" > "$f"
        with_spec_env "$B/llama-perplexity" -m "$GEMMA" -f "$TXT" -c 2048 --chunks $NCH -fa on -ctk $t -ctv $t -lv 4 -ngl 99 ${TL_PPL_ARGS:-} $kl >> "$f" 2>&1
        rc=$?
        log "ppl ${envset:+$envset }$t rc=$rc | $(grep -E 'Final estimate' "$f" | tail -1) | $(grep -E '^Mean +KLD' "$f" | tail -1) | $(grep -E '^Mean PPL\(Q\)' "$f" | tail -1) | $(grep -cE 'turbo K:' "$f") turbo-K lines | $(grep -E 'CUDA0 KV buffer size' "$f" | head -1)${TL_PPL_GREP:+ | $TL_PPL_GREP: $(grep -c "$TL_PPL_GREP" "$f") lines}"
    done
    grep -hE "turbo K:" "$OUT"/ppl-turbo3.log | head -3 >> "$OUT/summary.txt"
fi

if [[ " $PHASES " == *" cli "* ]]; then
    CLI=$B/llama-cli; [ -x "$WORK/tlprefix/bin/llama-cli" ] && CLI=$WORK/tlprefix/bin/llama-cli   # the installed copy (tlfull)
    log "llama-cli: $CLI"
    for t in turbo3 turbo2; do
        "$CLI" -m "$GEMMA" -ctk $t -ctv $t -fa on -ngl 99 -p "The capital of France is" -n 16 -st --temp 0 < /dev/null > "$OUT/cli-$t.log" 2>&1
        log "llama-cli -m gemma -ctk $t -ctv $t -fa on -ngl 99 -p 'The capital of France is' -n 16 -st --temp 0: rc=$? | $(grep -E 'Generation:' "$OUT/cli-$t.log" | tail -1)"
        "$B/llama-completion" -m "$GEMMA" -ctk $t -ctv $t -fa on -ngl 99 -p "The Jargon File is a glossary of" -n 40 --temp 0 -no-cnv < /dev/null > "$OUT/completion-$t.log" 2>"$OUT/completion-$t.err"
        log "llama-completion -ngl 99 $t greedy: $(tr '\n' ' ' < "$OUT/completion-$t.log" | head -c 300) | $(grep -E 'CUDA0 KV buffer|offloaded' "$OUT/completion-$t.err" | tr '\n' ' ' | head -c 200)"
    done
fi

if [[ " $PHASES " == *" kv "* ]] && [ -f "$REPO/ci/gpu-kv.sh" ]; then
    log "kv features (tests/test_kv_features.py on CUDA, -ngl 99)"
    timeout ${TL_KV_TIMEOUT:-300} bash "$REPO/ci/gpu-kv.sh" "$B" "$GEMMA" "$REPO/.devcarry/jargon.txt" "$OUT" 2>&1 | tail -5 | tee -a "$OUT/summary.txt"
fi

if [[ " $PHASES " == *" bench "* ]]; then
    # `turbo-llama bench` itself (gguf-py comes with the tree)
    tl_python
    export TURBO_LLAMA_BIN_DIR=$B TURBO_LLAMA_CACHE=$WORK/cache
    python3 -c "import matplotlib" 2>/dev/null || log "no matplotlib here: bench.png is drawn afterwards from bench.json"
    for run in ${TL_BENCH:-main}; do
        case $run in
            main) args="--types ${TL_TYPES:-f16,q8_0,q4_0,turbo3,turbo2} --depths ${TL_DEPTHS:-0,8192,32768} -p 512 -n 128 -r ${TL_REPS:-2} --rounds ${TL_ROUNDS:-1}" ;;
            deep) args="--types ${TL_DEEP_TYPES:-f16,turbo3,turbo2} --depths 131072 -p 0 -n 64 -r 1 --rounds ${TL_DEEP_ROUNDS:-1}" ;;
            v3)   args="--types turbo3,turbo2 --depths ${TL_DEPTHS:-0,8192,32768} -p 0 -n 128 -r ${TL_REPS:-2}"; export TURBO_FA_V3=1 ;;
            mma*) args="--types turbo3,turbo2 --depths ${TL_VAR_DEPTHS:-0,32768} -p 0 -n 128 -r ${TL_REPS:-2}"; export TURBO_FA_MMA=${run#mma} ;;
            cl)   args="--types turbo3,turbo2 --depths ${TL_VAR_DEPTHS:-0,8192} -p 0 -n 128 -r ${TL_REPS:-2}"; export TURBO_FA_CLUSTER=1 ;;
            steps*) args="--types turbo3 --depths ${TL_VAR_DEPTHS:-8192,32768} -p 0 -n 128 -r ${TL_REPS:-2}"; export TURBO_FA_MIN_STEPS=${run#steps} ;;
            hf)   args="--types turbo3,turbo2 --depths ${TL_VAR_DEPTHS:-0,32768} -p 0 -n 128 -r ${TL_REPS:-2}"; export TURBO_FA_HEADS_FIRST=1 ;;
            pre0) args="--types turbo3,turbo2 --depths ${TL_VAR_DEPTHS:-0,32768} -p 512 -n 0 -r ${TL_REPS:-2}"; export TURBO_FA_PREFILL=0 ;;
            nooff) args="--types turbo3 --depths 0 -p 0 -n 128 -r ${TL_REPS:-2}"; export TURBO_K_OFFSET=0 ;;
            env:*) args="--types turbo3,turbo2 --depths ${TL_VAR_DEPTHS:-0,8192} -p 0 -n 128 -r ${TL_REPS:-2}"   # env:A=1,B=2
                   for kv in $(echo "${run#env:}" | tr ',' ' '); do export "$kv"; done ;;
        esac
        if [ "$(el)" -gt "$DEADLINE" ]; then log "deadline: skipping bench $run"; continue; fi
        log "turbo-llama bench --shape llama8b --backend cuda $args  (run $run; env: $(env | grep -E '^TURBO_' | tr '\n' ' '))"
        name=bench-$(echo "$run" | tr ':=,' '_-_')
        python3 -m turbo_llama bench --shape llama8b --backend cuda $args --out "$OUT/$name" > "$OUT/$name.txt" 2>&1
        log "bench $run rc=$?"; cat "$OUT/$name/bench.md" >> "$OUT/summary.txt" 2>/dev/null || tail -5 "$OUT/$name.txt" >> "$OUT/summary.txt"
        for v in $(env | grep -oE '^TURBO_(FA|K|SET)_[A-Z0-9_]*'); do unset "$v"; done
        [ -f "$WORK/safe.env" ] && export $(cat "$WORK/safe.env")
    done
fi
log "done"
