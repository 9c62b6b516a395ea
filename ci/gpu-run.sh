#!/usr/bin/env bash
# turbo-llama on a CUDA machine (the H200 of the device tool, or any CUDA GPU): build, test, bench, eval, profile.
#
#   ci/gpu-run.sh [build] [test] [bench] [slots] [eval] [profile]    (default: build test bench; results in $OUT/summary.txt
#                                                               and $OUT/logs.tgz, $OUT defaults to /tmp/gpu-out)
#   build    the CUDA binaries into /tmp/tl/build/bin, one of (TL_BUILD):
#              cmake        (default) cmake + ninja of .devcarry/tree.tar.gz (the prepared tree) with the current cuda/
#                           sources copied over it; TL_TARGETS: the programs (default test-backend-ops llama-bench
#                           llama-perplexity), ~4 minutes on 16 cores
#                           TL_CMAKE_ARGS: more cmake arguments (e.g. -DLLAMA_BUILD_SERVER=ON for llama-server)
#              prebuilt     unpack .devcarry/prebuilt.tar.gz (made on a CPU machine by ci/make-prebuilt.sh)
#              turbo-llama  the product's own `turbo-llama build --cuda` from the pinned pristine tree
#                           (.devcarry/pristine.tar.gz; needs git on the machine and .devcarry/whl)
#            then test-turbo-cuda (cuda/test-turbo-cuda.cpp) is linked against it. A machine keeps /tmp while it stays
#            warm, so later calls need no build phase.
#   test     bit-exactness of the KV write (test-turbo-cuda), test-backend-ops -b CUDA0 for SET_ROWS, SUB_SET_ROWS, CPY,
#            GET_ROWS, FLASH_ATTN_EXT and ROPE_FLASH_ATTN with the turbo types, then the tests patch's perf cases
#            (the KV write, a plain copy, the decode op at 32K and 128K keys; TL_PERF= leaves them out)
#   bench    `turbo-llama bench --shape llama8b --backend cuda` (random Q4_0 weights of the Llama-3.1-8B shape):
#            TL_TYPES (f16,q8_0,turbo3,turbo2), TL_DEPTHS (0,32768), TL_ROUNDS (1), TL_REPS (1), -p 512 -n 128;
#            TL_PAIRS="q8_0/turbo3 f16/turbo3 ...": mixed K/V pairs by llama-bench -n 128 at TL_PAIR_DEPTHS (32768)
#   slots    four server-like slots at 32K each: llama-batched-bench -npp 32768 -ntg 128 -npl 4 (one KV stream per
#            sequence) on the llama8b random GGUF, TL_SLOT_TYPES (f16 turbo3) alternating for TL_SLOT_ROUNDS (2) rounds; needs llama-batched-bench in
#            the build (TL_TARGETS, or TL_PREBUILT_TARGETS of ci/make-prebuilt.sh); results/gpu.md "Four slots at 32K each"
#   eval     Gemma 3 270M perplexity and KLD against its own f16 on the GPU (llama-perplexity -fa on -ngl 99): the
#            GGUF travels in parts (.devcarry/*/g00 .. g04, as ci/gpu-eval.sh takes them; a warm machine keeps each
#            call's parts) and is joined when all are there; TL_PPL_TYPES (f16 q8_0 turbo3 turbo2), TL_PPL_ARGS (e.g. -ub 1: every
#            token a decode step), TL_PPL_TEXT (.devcarry/<name>.txt, default text), TL_PPL_CHUNKS (4)
#   profile  ncu of one decode op per kernel (TL_NCU: TYPE:KV:KERNEL specs) with the stall reasons and pipe use; with
#            TL_KTIME="f16 turbo3": every kernel of a few depth-0 decode steps timed and summed by name (ci/ktime.py);
#            TL_KTIME_DEPTH=32768: the decode attention's kernels of steps at that depth (not yet run on the H200);
#            TL_KTIME_NPL=32 TL_KTIME_DEPTH=4096: every kernel of decode steps of 32 sequences at 4096 keys each
#   (eval also runs ci/gpu-kv.sh: the KV-cache features on CUDA with Gemma)
#
# .devcarry is not in git: make it first on the CPU machine (a few minutes):
#   .venv/bin/turbo-llama prepare --out /tmp/prep && bash ci/make-devcarry.sh /tmp/prep
#   .venv/bin/python -m pip download --no-deps --only-binary :all: click tqdm -d .devcarry/whl
# and carry .devcarry/tree.tar.gz (build), .devcarry/whl (bench). The device tool carries at most 64 MiB per call.
# Time guard: bench starts no new run after ${TL_DEADLINE:-540} s.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
# the patch series of the pin: patches/pin.toml's [patches] series = "..." (no pin number in this script)
SERIES=$(sed -n 's/^series *= *"\([^"]*\)".*/\1/p' "$REPO/patches/pin.toml")
[ -n "$SERIES" ] && [ -f "$REPO/patches/$SERIES/overlay" ] || { echo "no patch series in $REPO/patches/pin.toml" >&2; exit 1; }
WORK=${TL_WORK:-/tmp/tl}; TREE=$WORK/tree; BUILD=$WORK/build; B=$BUILD/bin
# the device tool returns at most 8 files from $OUT: logs go to a folder of their own, and $OUT gets summary.txt plus
# one logs.tgz when the call ends
FINAL_OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$FINAL_OUT"
OUT=$WORK/logs/$(date +%H%M%S)-$$; mkdir -p "$OUT"
finish() { cp "$OUT/summary.txt" "$FINAL_OUT/summary.txt" 2>/dev/null; tar czf "$FINAL_OUT/logs.tgz" -C "$OUT" . 2>/dev/null; }
trap finish EXIT
DEADLINE=${TL_DEADLINE:-540}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el)s] $*" | tee -a "$OUT/summary.txt"; }
PHASES="${*:-build test bench}"
FAILED=0

log "machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null) | $(nproc) cores | nvcc $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*') | $(date -u +%FT%TZ) | phases: $PHASES"

# the prepared tree (for a build; gguf-py also serves turbo-llama bench), unpacked once per machine
mkdir -p "$WORK"
if [ ! -f "$TREE/CMakeLists.txt" ] && [ -f "$REPO/.devcarry/tree.tar.gz" ]; then
    tar xzf "$REPO/.devcarry/tree.tar.gz" -C "$WORK" || { log "tree.tar.gz unreadable"; exit 1; }
elif [ ! -d "$TREE" ] && [ -f "$REPO/.devcarry/mini.tar.gz" ]; then
    tar xzf "$REPO/.devcarry/mini.tar.gz" -C "$WORK" || { log "mini.tar.gz unreadable"; exit 1; }   # gguf-py only
fi
# the current cuda/ sources over the tree's copies, so that kernel changes need no new tarball
while read -r src dst; do
    case "$src" in cuda/*) [ -d "$(dirname "$TREE/$dst")" ] && cp "$REPO/$src" "$TREE/$dst" ;; esac
done < "$REPO/patches/$SERIES/overlay"

# the turbo-llama command on this machine: click and tqdm travel as wheels in .devcarry/whl
tl_python() {
    if [ ! -d /tmp/site/click ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$REPO"/.devcarry/whl/*.whl > /dev/null 2>&1 || log "wheel install failed"
    fi
    export PYTHONPATH=/tmp/site:$REPO/python:$TREE/gguf-py TURBO_LLAMA_DATA=$REPO PYTHONUNBUFFERED=1
}

build_test_turbo_cuda() {
    g++ -O2 -std=c++17 "$REPO/cuda/test-turbo-cuda.cpp" -I"$TREE/ggml/include" -L"$B" -lggml -lggml-base -lggml-cpu -lggml-cuda \
        -Wl,-rpath,"$B" -o "$B/test-turbo-cuda" >> "$OUT/build.log" 2>&1 || log "test-turbo-cuda build failed"
}

if [[ " $PHASES " == *" build "* ]]; then
    case "${TL_BUILD:-cmake}" in
    prebuilt)
        mkdir -p "$BUILD" && tar xzf "$REPO/.devcarry/prebuilt.tar.gz" -C "$BUILD" && touch "$B/.prebuilt" \
            && log "prebuilt binaries: $(ls "$B" | tr '\n' ' ')" || { log "prebuilt: no .devcarry/prebuilt.tar.gz"; exit 1; }
        ;;
    turbo-llama)
        tl_python
        rm -rf "$WORK/pristine" && mkdir -p "$WORK/pristine" && tar xzf "$REPO/.devcarry/pristine.tar.gz" -C "$WORK/pristine" \
            || { log "no .devcarry/pristine.tar.gz"; exit 1; }
        log "turbo-llama build --cuda --cuda-arch 90 --llama-src pristine --cmake-arg -DBUILD_SHARED_LIBS=ON"
        TURBO_LLAMA_CACHE=$WORK/tlcache python3 -m turbo_llama build --cuda --cuda-arch 90 --llama-src "$WORK/pristine" \
            --build-dir "$BUILD" --prefix "$WORK/tlprefix" --cmake-arg -DBUILD_SHARED_LIBS=ON > "$OUT/build.log" 2>&1 \
            || { log "turbo-llama build --cuda FAILED"; tail -30 "$OUT/build.log" | tee -a "$OUT/summary.txt"; exit 1; }
        build_test_turbo_cuda
        ;;
    *)
        log "configure + build (${TL_TARGETS:-test-backend-ops llama-bench llama-perplexity})"
        cmake -S "$TREE" -B "$BUILD" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
            -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_APP=OFF ${TL_CMAKE_ARGS:-} > "$OUT/build.log" 2>&1 \
            || { log "cmake failed"; tail -30 "$OUT/build.log" | tee -a "$OUT/summary.txt"; exit 1; }
        ninja -C "$BUILD" -j"$(nproc)" ${TL_TARGETS:-test-backend-ops llama-bench llama-perplexity} >> "$OUT/build.log" 2>&1 \
            || { log "build FAILED"; grep -B2 -A12 "error" "$OUT/build.log" | head -80 | tee -a "$OUT/summary.txt"; exit 1; }
        build_test_turbo_cuda
        ;;
    esac
    log "build ok"
fi
# prebuilt binaries find their libraries through LD_LIBRARY_PATH, in every later call of this machine as well
[ -f "$B/.prebuilt" ] && export LD_LIBRARY_PATH="$B:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [[ " $PHASES " == *" test "* ]]; then
    # every block written by SET_ROWS / CPY byte for byte against the C reference (f32 rows of 4096 blocks: the bulk
    # 2-thread kernel; of 384 blocks and f16 rows: the warp kernel), GET_ROWS bit for bit
    "$B/test-turbo-cuda" > "$OUT/bitexact.log" 2>&1; rc=$?
    log "test-turbo-cuda rc=$rc | $(grep -c 'rows identical' "$OUT/bitexact.log") cases | $(grep 'BITEXACT [PF]' "$OUT/bitexact.log")"
    [ "$rc" = 0 ] || FAILED=1
    : > "$OUT/tbo.log"
    # CPY turbo -> f16 is left out: the CPU reference (ggml-cpu dup) aborts on quantized -> f16
    for spec in "SET_ROWS|turbo" "SUB_SET_ROWS|turbo" "CPY|type_dst=turbo|type_src=turbo[234](_64)?,type_dst=f32" "GET_ROWS|turbo" \
                "FLASH_ATTN_EXT|turbo" "ROPE_FLASH_ATTN|turbo" ${TL_TESTS_MORE:-}; do
        op=${spec%%|*}; filt=${spec#*|}
        echo "=== test-backend-ops -b CUDA0 -o $op -p '$filt'" >> "$OUT/tbo.log"
        "$B/test-backend-ops" -b CUDA0 -o $op -p "$filt" > "$WORK/tbo_one.log" 2>&1; rc=$?
        cat "$WORK/tbo_one.log" >> "$OUT/tbo.log"
        log "test-backend-ops -b CUDA0 -o $op -p '$filt': rc=$rc | $(grep -E 'tests passed' "$WORK/tbo_one.log" | tail -1) | FAIL lines: $(grep -c FAIL "$WORK/tbo_one.log") | not supported: $(grep -c 'not supported' "$WORK/tbo_one.log") (turbo4: $(grep 'not supported' "$WORK/tbo_one.log" | grep -c turbo4))"
        [ "$rc" = 0 ] || FAILED=1
    done
    grep -E "FAIL" "$OUT/tbo.log" | head -40 >> "$OUT/summary.txt"
    if [ -n "${TL_PERF-1}" ]; then
        # the KV write (4096 f32 rows of 1024) against a plain copy of the same rows, and the decode op at 32K and 128K
        # keys (llama8b: 8 KV heads, GQA 4, mask) per K/V pair
        FA_PERF='hsk=128,hsv=128,nh=8,nr23=\[4,1\],kv=(32768|131072),nb=1,'
        { "$B/test-backend-ops" perf -b CUDA0 -o SET_ROWS; "$B/test-backend-ops" perf -b CUDA0 -o CPY
          "$B/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT -p "$FA_PERF"; } > "$OUT/perf.log" 2>&1
        sed 's/\x1b\[[0-9;]*m//g' "$OUT/perf.log" \
            | grep -E "((ne=|ne_src=)\[1024,4096,1,1\].*GB/s)|(FLASH_ATTN_EXT.*nh=8,nr23=\[4,1\].*us/run)" \
            | sed -E 's/max_bias=.*type_K=/type_K=/; s/,permute=[^)]*//' >> "$OUT/summary.txt"
    fi
fi

if [[ " $PHASES " == *" bench "* ]]; then
    tl_python
    export TURBO_LLAMA_BIN_DIR=$B TURBO_LLAMA_CACHE=$WORK/cache
    args="--types ${TL_TYPES:-f16,q8_0,turbo3,turbo2} --depths ${TL_DEPTHS:-0,32768} -p 512 -n 128 -r ${TL_REPS:-1} --rounds ${TL_ROUNDS:-1}"
    log "turbo-llama bench --shape llama8b --backend cuda $args"
    python3 -m turbo_llama bench --shape llama8b --backend cuda $args --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
    rc=$?; log "bench rc=$rc"; [ "$rc" = 0 ] || FAILED=1
    cat "$OUT/bench/bench.md" >> "$OUT/summary.txt" 2>/dev/null || tail -5 "$OUT/bench.txt" >> "$OUT/summary.txt"
    if [ -n "${TL_PAIRS:-}" ]; then
        # mixed K/V pairs (turbo-llama bench runs K = V); the same random GGUF, f16 first as the base of the ratios
        M8=$(python3 -c "from turbo_llama.bench.shapes import shape_gguf; from turbo_llama.eval import model; print(shape_gguf('llama8b', model.cache_root()/'shapes'))")
        for pair in f16/f16 $TL_PAIRS; do
            if [ "$(el)" -gt "$DEADLINE" ]; then log "deadline: skipping $pair"; continue; fi
            k=${pair%/*}; v=${pair#*/}
            "$B/llama-bench" -m "$M8" -fa 1 -ngl 99 -p 0 -n 128 -r ${TL_REPS:-1} -d ${TL_PAIR_DEPTHS:-32768} -ctk $k -ctv $v -o md > "$OUT/pair-$k-$v.md" 2>&1
            log "llama-bench -fa 1 -ngl 99 -p 0 -n 128 -d ${TL_PAIR_DEPTHS:-32768} -ctk $k -ctv $v: rc=$? | $(grep -E '\| +tg128' "$OUT/pair-$k-$v.md" | tr -s ' ' | sed -E 's/.*\| (tg128[^|]*)\| +([0-9.]+ ± [0-9.]+) \|/\1 \2/' | tr '\n' ';')"
        done
    fi
fi

if [[ " $PHASES " == *" slots "* ]]; then
    tl_python; export TURBO_LLAMA_CACHE=$WORK/cache
    M8=$(python3 -c "from turbo_llama.bench.shapes import shape_gguf; from turbo_llama.eval import model; print(shape_gguf('llama8b', model.cache_root()/'shapes'))")
    for r in $(seq 1 "${TL_SLOT_ROUNDS:-2}"); do
        for t in ${TL_SLOT_TYPES:-f16 turbo3}; do
            if [ "$(el)" -gt "$DEADLINE" ]; then log "deadline: skipping slots $t round $r"; continue; fi
            f="$OUT/slots-$t-$r.txt"
            "$B/llama-batched-bench" -m "$M8" -c $((4 * (32768 + 128 + 16))) -b 2048 -ub 512 -npp 32768 -ntg 128 -npl 4 \
                -fa on -ngl 99 -ctk $t -ctv $t > "$f" 2>&1
            rc=$?; [ "$rc" = 0 ] || FAILED=1
            log "llama-batched-bench -npp 32768 -ntg 128 -npl 4 -ctk $t -ctv $t (round $r): rc=$rc | $(grep -E '^\|\s+32768' "$f" | tr -s ' ')"
        done
    done
fi

GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 GEMMA_BYTES=253113024
GEMMA=${TLE_WORK:-/tmp/tle}/g.gguf
if [[ " $PHASES " == *" eval "* ]]; then
    # the 241 MiB GGUF travels in parts g00..g04 (split -b 56m -d -a 2, any .devcarry/*/ folder; 64 MiB a call), joined
    # and checked by ci/gpu-eval.sh once all are here
    mkdir -p "${TLE_WORK:-/tmp/tle}/parts"; for f in "$REPO"/.devcarry/*/g[0-9][0-9]; do [ -f "$f" ] && cp "$f" "${TLE_WORK:-/tmp/tle}/parts/"; done
    bash "$REPO/ci/gpu-eval.sh" assemble g "$GEMMA_BYTES" "$GEMMA_SHA" 2>&1 | while read -r l; do log "eval: $l"; done
    if [ ! -f "$GEMMA" ]; then
        log "eval: no Gemma GGUF yet (its parts g00..g04 come one call at a time)"
    else
        TXTN=${TL_PPL_TEXT:-text}; TXT=$REPO/.devcarry/$TXTN.txt; NCH=${TL_PPL_CHUNKS:-4}
        for t in ${TL_PPL_TYPES:-f16 q8_0 turbo3 turbo2}; do   # f16 first: the others' KLD base
            f="$OUT/ppl-$t.log"
            kl="--kl-divergence-base $WORK/f16-logits-$TXTN-$NCH.bin"; [ "$t" != f16 ] && kl="$kl --kl-divergence"
            cmd="llama-perplexity -m gemma-3-270m-q4_k_m.gguf -f $TXTN.txt -c 2048 --chunks $NCH -fa on -ctk $t -ctv $t -ngl 99 ${TL_PPL_ARGS:-}"
            echo "=== $cmd" > "$f"
            "$B/llama-perplexity" -m "$GEMMA" -f "$TXT" -c 2048 --chunks $NCH -fa on -ctk $t -ctv $t -ngl 99 ${TL_PPL_ARGS:-} $kl >> "$f" 2>&1
            rc=$?; [ "$rc" = 0 ] || FAILED=1
            log "$cmd: rc=$rc | $(grep -E 'Final estimate' "$f" | tail -1) | $(grep -E '^Mean +KLD' "$f" | tail -1)"
        done
        # the KV-cache features (save/restore, shift, sequences) on CUDA, as tests/test_kv_features.py runs them on the CPU
        timeout ${TL_KV_TIMEOUT:-300} bash "$REPO/ci/gpu-kv.sh" "$B" "$GEMMA" "$REPO/.devcarry/jargon.txt" "$OUT" 2>&1 | tail -5 | tee -a "$OUT/summary.txt"
    fi
fi

if [[ " $PHASES " == *" profile "* ]]; then
    if command -v ncu > /dev/null; then
        # spec TYPE:KV:KERNEL: the decode op of the tests patch's perf case (llama8b: 8 KV heads, GQA 4, mask)
        for spec in ${TL_NCU:-"turbo3:131072:k_turbo_fattn_mma" "f16:131072:flash_attn" "turbo3:32768:k_turbo_fattn_mma"}; do
            IFS=: read -r ty kv kern <<< "$spec"
            f="$OUT/ncu-$ty-$kv.txt"
            timeout ${TL_NCU_TIMEOUT:-150} ncu --clock-control none --set full -k "regex:$kern" -c 1 \
                --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__(inst_executed_pipe|pipe)_.*\.avg\.pct_of_peak_sustained_active,smsp__inst_executed.sum" \
                "$B/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT -p "nh=8,nr23=\[4,1\],kv=$kv,nb=1,.*type_K=$ty,type_V=$ty" > "$f" 2>&1
            log "ncu $ty kv=$kv ($kern): rc=$? | $(grep -E '^ +(Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per Thread) ' "$f" | tr -s ' ' | tr '\n' ';' | head -c 400)"
        done
        # where a depth-0 decode step's time goes, per kernel (TL_KTIME: cache types): ncu times every launch of a few
        # steps of llama-bench on the llama8b random GGUF (CUDA graphs off), ci/ktime.py sums them by kernel name
        if [ -n "${TL_KTIME:-}" ]; then
            tl_python; export TURBO_LLAMA_CACHE=$WORK/cache
            M8=$(python3 -c "from turbo_llama.bench.shapes import shape_gguf; from turbo_llama.eval import model; print(shape_gguf('llama8b', model.cache_root()/'shapes'))")
        fi
        # TL_KTIME_DEPTH (default 0): the steps at that depth; then only the decode attention's kernels are timed
        # (TL_KTIME_KERNELS, a regex), so that the depth's prefill is neither profiled nor counted
        KD=${TL_KTIME_DEPTH:-0}
        KSEL=(); [ "$KD" != 0 ] && KSEL=(-k "regex:${TL_KTIME_KERNELS:-flash_attn_ext_vec|flash_attn_combine|k_turbo_fattn}")
        # TL_KTIME_NPL=N: instead, N sequences (one KV stream each) decoding at TL_KTIME_DEPTH keys each
        # (llama-batched-bench with one shared prompt, so that a single prompt is prefilled): every kernel of the
        # last 3 decode steps, summed per token of those steps
        NPL=${TL_KTIME_NPL:-0}
        [ "$NPL" != 0 ] && KSEL=()
        for t in ${TL_KTIME:-}; do
            f="$OUT/ktime-$t-d$KD-n$NPL.csv"
            if [ "$NPL" != 0 ]; then
                GGML_CUDA_DISABLE_GRAPHS=1 timeout ${TL_NCU_TIMEOUT:-150} ncu --clock-control none --cache-control none \
                    --metrics gpu__time_duration.sum --csv --print-units base \
                    "$B/llama-batched-bench" -m "$M8" -c $((NPL*(KD+128))) -b 2048 -ub 512 -npp "$KD" -ntg 4 -npl "$NPL" -pps \
                    -fa on -ngl 99 -ctk $t -ctv $t > "$f" 2> "$f.err"
                log "ktime $t (llama8b, $NPL sequences at depth $KD, the last 3 decode steps): rc=$?"
                python3 "$REPO/ci/ktime.py" --last-steps 3 "$f" $((3*NPL)) 2>&1 | head -24 | tee -a "$OUT/summary.txt"
                continue
            fi
            GGML_CUDA_DISABLE_GRAPHS=1 timeout ${TL_NCU_TIMEOUT:-150} ncu --clock-control none --cache-control none "${KSEL[@]}" \
                --metrics gpu__time_duration.sum --csv --print-units base \
                "$B/llama-bench" -m "$M8" -p 0 -n 8 -d "$KD" -r 1 -fa 1 -ngl 99 -ctk $t -ctv $t --no-warmup > "$f" 2> "$f.err"
            log "ktime $t (llama8b, depth $KD, 8 tokens${KSEL:+, kernels ${KSEL[1]}}): rc=$?"
            python3 "$REPO/ci/ktime.py" "$f" 8 2>&1 | head -16 | tee -a "$OUT/summary.txt"
        done
    else
        log "profile: no ncu here"
    fi
fi
log "done (failures: $FAILED)"
exit $FAILED
