#!/usr/bin/env python3
"""Writes the fuzz seed corpora into tests/fuzz/corpus/<target>/ from the test fixtures
(tests/fixtures/pattern/*) plus small hand-made safetensors, .npy and model files that cover
every dtype, format version and optional field. Deterministic; rerun after adding fixtures."""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, '..', 'fixtures', 'pattern')
OUT = os.path.join(HERE, 'corpus')


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data)


def safetensors(tensors, pad=True, meta=None):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, off, blobs = {}, 0, []
    if meta is not None:
        header['__metadata__'] = meta
    for name, dt, shape, raw in tensors:
        header[name] = {'dtype': dt, 'shape': shape, 'data_offsets': [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(header, separators=(',', ':')).encode()
    if pad:
        h += b' ' * ((8 - len(h) % 8) % 8)
    return struct.pack('<Q', len(h)) + h + b''.join(blobs)


def npy(descr, shape, raw, version=1):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    pre = 10 if version == 1 else 12
    total = (pre + len(d) + 1 + 63) // 64 * 64
    d = d + ' ' * (total - pre - len(d) - 1) + '\n'
    if version == 1:
        head = b'\x93NUMPY\x01\x00' + struct.pack('<H', len(d))
    else:
        head = b'\x93NUMPY' + bytes([version, 0]) + struct.pack('<I', len(d))
    return head + d.encode() + raw


def f32(vals):
    return struct.pack('<%df' % len(vals), *vals)


def f16(vals):
    return struct.pack('<%de' % len(vals), *vals)


def bf16(vals):
    return b''.join(struct.pack('<f', v)[2:] for v in vals)


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    patterns = {}
    for case in sorted(os.listdir(FIX)):
        p = os.path.join(FIX, case, 'pattern.json')
        if os.path.exists(p):
            with open(p, 'rb') as f:
                data = f.read()
            put('pattern', case + '.json', data)
            if case.startswith('ok_'):
                patterns[case] = json.loads(data)

    vals = [((i * 37) % 11 - 5) / 4.0 for i in range(64)]
    put('safetensors', 'f32.st', safetensors([('a.weight', 'F32', [2, 3], f32(vals[:6])),
                                              ('a.bias', 'F32', [2], f32(vals[6:8]))]))
    put('safetensors', 'f16_bf16.st', safetensors([('x', 'F16', [4], f16(vals[:4])),
                                                   ('y', 'BF16', [2, 2], bf16(vals[4:8]))],
                                                  meta={'format': 'pt'}))
    put('safetensors', 'other_dtypes.st', safetensors([('i', 'I64', [2], struct.pack('<2q', 1, 2)),
                                                      ('b', 'BOOL', [3], b'\x00\x01\x00'),
                                                      ('e', 'F32', [0], b'')]))
    put('safetensors', 'unpadded.st', safetensors([('u', 'F16', [3], f16(vals[:3]))], pad=False))
    put('safetensors', 'empty.st', safetensors([]))

    put('npy', 'f4_v1.npy', npy('<f4', '(2, 3)', f32(vals[:6])))
    put('npy', 'f2_v2.npy', npy('<f2', '(3, 2)', f16(vals[:6]), version=2))
    put('npy', 'f4_v3_empty.npy', npy('<f4', '(0, 4)', b'', version=3))
    put('npy', 'f4_1d.npy', npy('<f4', '(4,)', f32(vals[:4])))

    # Emitter inputs: a config selector byte, then an ok_ pattern.
    for case, pat in sorted(patterns.items()):
        with open(os.path.join(FIX, case, 'pattern.json'), 'rb') as f:
            data = f.read()
        for sel in (0x00, 0x01, 0x02, 0x03, 0x18, 0x25, 0x47, 0x8c):
            put('emit', '%s_%02x' % (case, sel), bytes([sel]) + data)

    # Tuning logs: ok, failed (inf), wrong_result and a torn last line, on cpu and cuda.
    def record(backend, device, arch, m, config, status, median, layer='a', hsh='a3014f2a2137b643'):
        res = {'status': status, 'median': median}
        if status == 'ok':
            res.update({'times': [median] * 3, 'reps': 3, 'build_s': 0.01})
        else:
            res['error'] = 'it failed'
        return json.dumps({'format': 'tilejit-tune', 'version': 1,
                           'target': {'backend': backend, 'device': device, 'arch': arch, 'driver': '',
                                      'compiler': 'LLVM 19.1.7'},
                           'workload': {'layer': layer, 'pattern_hash': hsh, 'n': 64, 'k': 48, 'g': 32,
                                        'kept': 1536, 'dtype': 'f32', 'm': m},
                           'config': config, 'result': res, 'tool': 'tilejit 0.1.0',
                           'timestamp': '2026-11-29T15:19:14Z'}, separators=(',', ':'))
    cpu = {'mb': 0, 'mr': 12, 'nr': 32, 'offsets': 'table', 'unroll': 4}
    cpu2 = {'mb': 0, 'mr': 4, 'nr': 32, 'offsets': 'unrolled', 'unroll': 8}
    cuda = {'bk': 32, 'bm': 128, 'bn': 32, 'dtype': 'f16', 'layout': 'fm', 'offsets': 'table',
            'out': 'f32', 'stages': 3, 'template': 'mma', 'warps': 4}
    lines = [record('cpu', 'rocketlake', 'x86_64-avx512', 3, cpu, 'ok', 0.0018),
             record('cpu', 'rocketlake', 'x86_64-avx512', 3, cpu2, 'ok', 0.0015),
             record('cpu', 'rocketlake', 'x86_64-avx512', 64, cpu2, 'wrong_result', 'inf'),
             record('cpu', 'other', 'x86_64-avx512', 512, cpu, 'timeout', None),
             record('cuda', 'NVIDIA H200', 'sm_90', 128, cuda, 'ok', 0.00002),
             record('cuda', 'NVIDIA H200', 'sm_90', 128, cuda, 'compile_error', 'inf')]
    put('tuning', 'mixed.jsonl', ('\n'.join(lines) + '\n').encode())
    put('tuning', 'torn.jsonl', ('\n'.join(lines[:2]) + '\n' + lines[2][:57]).encode())
    put('tuning', 'one.jsonl', (lines[4] + '\n').encode())
    put('tuning', 'blank_and_garbage.jsonl', b'\n\n{"format":"tilejit-tune"}\nnot json\n' + lines[0].encode())

    # Models: each ok_ fixture with weights of every dtype, with and without bias.
    packers = {'F32': f32, 'F16': f16, 'BF16': bf16}
    for i, (case, pat) in enumerate(sorted(patterns.items())):
        for j, dt in enumerate(['F32', 'F16', 'BF16']):
            tensors = []
            for layer in pat['layers']:
                n, k = layer['n'], layer['k']
                w = [vals[(a * 3 + j) % 64] for a in range(n * k)]
                tensors.append((layer['name'] + '.weight', dt, [n, k], packers[dt](w)))
                if (i + j) % 2 == 0:
                    tensors.append((layer['name'] + '.bias', 'F32', [n], f32(vals[:n])))
            pj = json.dumps(pat).encode()
            put('model', '%s_%s.bin' % (case, dt.lower()),
                struct.pack('<I', len(pj)) + pj + safetensors(tensors, pad=(j != 1)))


if __name__ == '__main__':
    main()
