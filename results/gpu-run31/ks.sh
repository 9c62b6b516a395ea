#!/usr/bin/env bash
# H1: tests/c/kshift_nll.cpp (with KS_NGL -> n_gpu_layers) linked against the CUDA build, run with -ngl 99 on Gemma
B=/tmp/tl/build/bin; T=/tmp/tl/tree; O=${OUT:-/tmp/h1/out}; mkdir -p $O
t0=$(date +%s); while [ ! -f /tmp/tle/build.rc ] && [ $(( $(date +%s) - t0 )) -lt ${KS_WAIT:-200} ]; do sleep 2; done
echo "build.rc=$(cat /tmp/tle/build.rc 2>/dev/null) after $(( $(date +%s) - t0 )) s wait"
[ -x /tmp/h1/kshift_nll ] || g++ -O2 -std=c++17 /tmp/h1/kshift_nll.cpp -I$T/include -I$T/ggml/include -L$B -lllama -lggml -lggml-base \
    -Wl,-rpath,$B -o /tmp/h1/kshift_nll 2>&1 | tail -20
ls -la /tmp/h1/kshift_nll || exit 1
for p in ${KS_TYPES:-f16 turbo3}; do
  s=$(date +%s)
  echo "=== KS_NGL=99 kshift_nll g.gguf jargon.txt $p $p windows=8 prefix=256 cont=128 start=96 threads=16" | tee $O/ks-$p.txt
  KS_NGL=99 /tmp/h1/kshift_nll /tmp/tle/g.gguf /tmp/h1/jargon.txt $p $p windows=8 prefix=256 cont=128 start=96 threads=16 >> $O/ks-$p.txt 2>&1
  echo "rc=$? $(( $(date +%s) - s )) s" | tee -a $O/ks-$p.txt; grep RESULT $O/ks-$p.txt; tail -3 $O/ks-$p.txt
done
