#!/usr/bin/env bash
# Key studies on the CPU (#51): a study llama-perplexity with switches (ci/study-keys.diff, not shipped code),
# each cache against the same run with an f16 cache (4 chunks of 2048, --kl-divergence).
#
#   ci/study-keys.sh MODEL TEXT SPEC...        e.g. ci/study-keys.sh qwen.gguf kjv turbo3 turbo3:k8=0,1
#
# SPEC is TYPE (the cache, K and V) or TYPE with one switch. (The exact-window switches of this study shipped as the
# cache's recent window, TURBO_WINDOW: their diff and results are in git history, results/k-transforms.md.)
#   TYPE:k8=L,L  q8_0 keys in those layers (TURBO_STUDY_K8), the shipped paths otherwise.
# TEXT: jargon, kjv or code (the eval's texts in $TURBO_LLAMA_CACHE/texts) or a file. The study tree is a copy of
# the prepared tree (`turbo-llama prepare`; its path from `turbo-llama info`) with the diff applied, built once in
# $STUDY_DIR (default /tmp/turbo-study; a cold build takes ~8 minutes on 2 cores; rebuilt when the diff changes);
# one line per spec on stdout.
set -eu
[ $# -ge 3 ] || { sed -n 2,13p "$0"; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${TURBO_LLAMA_CACHE:-$HOME/.cache/turbo-llama}
W=${STUDY_DIR:-/tmp/turbo-study}; B=$W/build/bin
TL=${TURBO_LLAMA:-$REPO/.venv/bin/turbo-llama}
SRC=$("$TL" info 2>/dev/null | sed -n 's/^prepared: *[0-9a-f]* (\(.*\))/\1/p')
MODEL=$1; TEXT=$2; shift 2
[ -f "$MODEL" ] || { echo "no model file $MODEL" >&2; exit 1; }
[ -f "$TEXT" ] || TEXT=$CACHE/texts/$TEXT.txt
[ -f "$TEXT" ] || { echo "no text $TEXT (jargon, kjv, code or a file)" >&2; exit 1; }
[ -n "$SRC" ] && [ -d "$SRC/ggml" ] || { echo "no prepared tree (turbo-llama info): run turbo-llama prepare first" >&2; exit 1; }

if [ ! -x "$B/llama-perplexity" ] || ! cmp -s "$REPO/ci/study-keys.diff" "$W/applied.diff"; then
    rm -rf "$W/tree" "$B/llama-perplexity"; mkdir -p "$W"; cp -a "$SRC" "$W/tree"; rm -rf "$W/tree/.git"
    patch -s -p1 -d "$W/tree" < "$REPO/ci/study-keys.diff"
    cp "$REPO/ci/study-keys.diff" "$W/applied.diff"
    cmake -S "$W/tree" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON \
        > "$W/cmake.log" 2>&1 || { tail -20 "$W/cmake.log" >&2; exit 1; }
    echo "building the study llama-perplexity in $W/build ..." >&2
    cmake --build "$W/build" --target llama-perplexity -j "$(nproc)" > "$W/build.log" 2>&1 || { tail -20 "$W/build.log" >&2; exit 1; }
fi

P=(-m "$MODEL" -f "$TEXT" -c 2048 --chunks "${CHUNKS:-4}" -fa on -t "$(nproc)" -nr -lv 4)
name=$(basename "$MODEL" .gguf)-$(basename "$TEXT" .txt)
base=$W/$name-f16.kld
if [ ! -f "$base" ]; then
    echo "f16 base logits of $name ..." >&2
    "$B/llama-perplexity" "${P[@]}" -ctk f16 -ctv f16 --kl-divergence-base "$base" > "$W/$name-f16.log" 2>&1 ||
        { tail -5 "$W/$name-f16.log" >&2; exit 1; }
fi
for spec in "$@"; do
    t=${spec%%:*}; sw=${spec#"$t"}; sw=${sw#:}
    envs=()   # the study's switches (unset unless the spec sets them)
    case $sw in
        "")        ;;
        k8=*)      envs=(TURBO_STUDY_K8="${sw#k8=}") ;;
        *)         echo "bad spec $spec (TYPE or TYPE:k8=L,L)" >&2; exit 2 ;;
    esac
    log=$W/$name-${spec//[:=,]/_}.log
    unset=(-u TURBO_STUDY_K8)
    env "${unset[@]}" "${envs[@]}" "$B/llama-perplexity" "${P[@]}" \
        -ctk "$t" -ctv "$t" --kl-divergence-base "$base" --kl-divergence > "$log" 2>&1 || { tail -5 "$log" >&2; exit 1; }
    ratio=$(sed -n 's/^Mean PPL(Q)\/PPL(base) *: *\([0-9.]*\).*/\1/p' "$log")
    kld=$(sed -n 's/^Mean *KLD: *\([0-9.]*\).*/\1/p' "$log")
    echo "$name $spec: PPL/PPL(f16) x$ratio KLD $kld"
done
