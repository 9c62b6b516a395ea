#!/bin/bash
# run 37, call S (lead): branch shortctx's binaries (ci/make-prebuilt.sh on the CPU machine, carried as
# .devcarry/prebuilt.tar.gz) and helper-B's script (S/run.sh, carried as .devcarry/hB-run.sh); the GGUF made meanwhile
mkdir -p /tmp/tl/build && tar xzf .devcarry/prebuilt.tar.gz -C /tmp/tl/build && tar xzf .devcarry/mini.tar.gz -C /tmp/tl
export LD_LIBRARY_PATH=/tmp/tl/build/bin:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
export M8=/tmp/tlcache/shapes/random-llama8b-q4_0.gguf
( PYTHONPATH=python:/tmp/tl/tree/gguf-py python3 -c "from pathlib import Path; from turbo_llama.shapes import shape_gguf; print(shape_gguf('llama8b', Path('/tmp/tlcache/shapes')))" > /tmp/m8.txt 2>&1 ) &
bash .devcarry/hB-run.sh
