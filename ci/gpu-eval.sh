#!/usr/bin/env bash
# turbo-llama: `turbo-llama eval --backend cuda` of a GGUF that reaches the device machine in parts (64 MiB a call).
#
#   here:   mkdir -p .devcarry/q && (cd .devcarry/q && split -b 56m -d -a 2 MODEL.gguf q)     parts q00, q01, ...
#           (56 MiB: a part plus the checked-out tree must stay under the 64 MiB a call carries; 60 MiB was refused)
#   there:  bash ci/gpu-eval.sh parts          copies the carried parts (.devcarry/*/*NN) to /tmp/tle/parts; the
#                                              first call (carrying .devcarry/tree.tar.gz) also starts the CUDA build
#                                              of llama-perplexity + llama-server (ci/gpu-run.sh build) in a session
#                                              of its own, so it runs on while later calls bring the parts
#           bash ci/gpu-eval.sh start TAG PREFIX BYTES SHA256 [EVAL ARGS]
#                                              assembles PREFIX* into /tmp/tle/PREFIX.gguf (size and sha256 checked),
#                                              then, in the background, once the build is done and no other eval runs:
#                                              turbo-llama eval --backend cuda --model /tmp/tle/PREFIX.gguf
#                                              --out /tmp/tle/TAG [EVAL ARGS]   (log /tmp/tle/TAG.log, rc TAG.rc)
#           bash ci/gpu-eval.sh assemble PREFIX BYTES SHA256   the parts' join alone (ci/gpu-run.sh's eval uses it)
#           bash ci/gpu-eval.sh wait SECONDS TAG...   waits for those evals (at most SECONDS), tars each
#                                              record + log into $OUT/TAG.tgz
#           bash ci/gpu-eval.sh status         parts, build and evals on this machine
# The machine keeps /tmp while it stays warm (30 s between calls): issue the calls back to back.
# Rehearsal on a CPU machine: TLE_BIN=.venv/bin (no build), TLE_PY=.venv/bin/python and CPU eval args (--backend is taken from EVAL ARGS
# when given there, e.g. --backend cpu --types f16 --chunks 1 --no-niah).
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
W=${TLE_WORK:-/tmp/tle}; mkdir -p "$W/parts"
B=${TLE_BIN:-/tmp/tl/build/bin}
OUT=${OUT:-$W/out}; mkdir -p "$OUT"

build_state() {
    if [ -n "${TLE_BIN:-}" ]; then echo done; return; fi
    if [ -f "$W/build.rc" ]; then [ "$(cat "$W/build.rc")" = 0 ] && echo done || echo failed
    elif [ -f "$W/build.started" ]; then echo running; else echo none; fi
}

status() {
    echo "parts: $(ls "$W/parts" | tr '\n' ' ')($(du -sm "$W/parts" | cut -f1) MiB)"
    echo "build: $(build_state) $(tail -2 "$W/build.out" 2>/dev/null | tr '\n' ' ')"
    [ "$(build_state)" = failed ] && tail -25 "$W/build.out"
    for l in "$W"/*.log; do [ -f "$l" ] || continue; t=$(basename "$l" .log)
        echo "eval $t: rc=$(cat "$W/$t.rc" 2>/dev/null || echo -) | $(tail -c 300 "$l" | tr '\r\n' '  ' | tail -c 200)"; done
}

# assemble PREFIX BYTES SHA256: the carried parts PREFIX00, PREFIX01, ... joined into $W/PREFIX.gguf (size and sha256
# checked; once per machine)
assemble() {
    local prefix=$1 bytes=$2 sha=$3 m=$W/$1.gguf parts have got
    [ -f "$m" ] && return 0
    parts=$(ls "$W"/parts/"$prefix"[0-9][0-9] 2>/dev/null | sort)
    have=$(cat $parts 2>/dev/null | wc -c)
    [ "$have" = "$bytes" ] || { echo "$prefix parts hold $have bytes of $bytes"; return 1; }
    cat $parts > "$m.tmp"
    got=$(sha256sum "$m.tmp" | cut -d' ' -f1)
    [ "$got" = "$sha" ] || { echo "$prefix: sha256 $got, not $sha"; rm -f "$m.tmp"; return 1; }
    mv "$m.tmp" "$m"; echo "$prefix.gguf assembled: $bytes bytes, sha256 ok"
}

case "${1:-status}" in
parts)
    for f in "$REPO"/.devcarry/*/*[0-9][0-9]; do    # new parts only (a warm machine keeps the earlier ones)
        [ -f "$f" ] && [ "$(stat -c %s "$f")" != "$(stat -c %s "$W/parts/${f##*/}" 2>/dev/null)" ] && cp "$f" "$W/parts/"; done
    if [ "$(build_state)" = none ] && [ -f "$REPO/.devcarry/tree.tar.gz" ]; then
        mkdir -p /tmp/tl && tar xzf "$REPO/.devcarry/tree.tar.gz" -C /tmp/tl && touch "$W/build.started"
        setsid nohup bash -c "OUT=$W/buildout TL_TARGETS='llama-perplexity llama-server' \
            TL_CMAKE_ARGS=-DLLAMA_BUILD_SERVER=ON bash '$REPO/ci/gpu-run.sh' build > '$W/build.out' 2>&1; echo \$? > '$W/build.rc'" \
            < /dev/null > /dev/null 2>&1 &
        echo "build started"
    fi
    status ;;
start)
    tag=$2 prefix=$3 bytes=$4 sha=$5; shift 5
    m=$W/$prefix.gguf
    assemble "$prefix" "$bytes" "$sha" || { echo "start $tag: no model"; status; exit 1; }
    backend=cuda; case " $* " in *" --backend "*) backend= ;; esac
    rm -f "$W/$tag.rc"
    # one eval at a time (flock), after the build
    setsid nohup bash -c "
        while [ \"\$(bash '$REPO/ci/gpu-eval.sh' buildstate)\" = running ]; do sleep 2; done
        exec 9> '$W/eval.lock'; flock 9
        [ \"\$(bash '$REPO/ci/gpu-eval.sh' buildstate)\" = done ] || { echo 'no build' > '$W/$tag.log'; echo 1 > '$W/$tag.rc'; exit; }
        cd '$REPO'
        export PYTHONPATH='$REPO/python:/tmp/tl/tree/gguf-py'${TLE_PYTHONPATH:+:$TLE_PYTHONPATH} TURBO_LLAMA_DATA='$REPO' TURBO_LLAMA_BIN_DIR='$B' \
               TURBO_LLAMA_CACHE='$W/cache' PYTHONUNBUFFERED=1
        echo \"=== \$(date -u +%FT%TZ) turbo-llama eval ${backend:+--backend $backend }--model $m --out $W/$tag $*\" > '$W/$tag.log'
        start=\$(date +%s)
        ${TLE_PY:-python3} -m turbo_llama eval ${backend:+--backend $backend} --model '$m' --out '$W/$tag' $* >> '$W/$tag.log' 2>&1
        rc=\$?; echo \"=== rc=\$rc after \$(( \$(date +%s) - start )) s\" >> '$W/$tag.log'; echo \$rc > '$W/$tag.rc'" \
        < /dev/null > /dev/null 2>&1 &
    echo "eval $tag queued (build: $(build_state))" ;;
buildstate) build_state ;;
assemble) shift; assemble "$@" ;;
wait)
    max=$2; shift 2; t0=$(date +%s)
    for tag in "$@"; do
        while [ ! -f "$W/$tag.rc" ] && [ $(( $(date +%s) - t0 )) -lt "$max" ]; do sleep 2; done
        tar czf "$OUT/$tag.tgz" -C "$W" "$tag" "$tag.log" 2>/dev/null
        echo "eval $tag: rc=$(cat "$W/$tag.rc" 2>/dev/null || echo 'still running') after $(( $(date +%s) - t0 )) s of waiting"
    done
    status ;;
*) status ;;
esac
