# reads a dump of studies/key-scale/qkv_dump1.cpp: {tensor name: float32 array}
import struct
import numpy as np


def load(fn):
    out = {}
    with open(fn, 'rb') as f:
        n, = struct.unpack('i', f.read(4))
        for _ in range(n):
            L, = struct.unpack('i', f.read(4)); name = f.read(L).decode()
            ne = struct.unpack('4q', f.read(32)); cnt = int(np.prod(ne))
            out[name] = np.frombuffer(f.read(4 * cnt), np.float32).reshape(ne[::-1])
    return out
