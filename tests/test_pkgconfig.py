#!/usr/bin/env python3
"""The installed tilejit.pc names every library that libtilejit.so links (suite unit): jansson,
and OpenBLAS when the build found it (Requires.private, from meson's pkgconfig module, which adds
the library's dependencies), so `pkg-config --static --libs tilejit` links a static libtilejit.a.
Usage: test_pkgconfig.py BUILD_DIR HAVE_OPENBLAS(0|1)"""
import os
import shutil
import subprocess
import sys


def fields(path):
    out = {}
    with open(path) as f:
        for line in f:
            if ':' in line and '=' not in line.split(':', 1)[0]:
                k, v = line.split(':', 1)
                out[k.strip()] = v.strip()
    return out


def main():
    build, have_openblas = sys.argv[1], sys.argv[2] == '1'
    pc_dir = os.path.join(build, 'meson-private')
    pc = os.path.join(pc_dir, 'tilejit.pc')
    f = fields(pc)
    requires = [r.strip().split()[0] for r in f.get('Requires.private', '').split(',') if r.strip()]
    libs = f.get('Libs.private', '').split()
    bad = []
    if 'jansson' not in requires:
        bad.append('jansson is not in Requires.private: %r' % requires)
    listed = 'openblas' in requires or '-lopenblas' in libs
    if have_openblas and not listed:
        bad.append('built with OpenBLAS, but tilejit.pc lists it neither in Requires.private (%r) nor in '
                   'Libs.private (%r)' % (requires, libs))
    if not have_openblas and listed:
        bad.append('built without OpenBLAS, but tilejit.pc lists it')
    if shutil.which('pkg-config'):
        env = dict(os.environ, PKG_CONFIG_PATH=pc_dir)
        r = subprocess.run(['pkg-config', '--static', '--libs', 'tilejit'], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            bad.append('pkg-config --static --libs tilejit failed: ' + r.stderr.strip())
        else:
            words = r.stdout.split()
            for lib in ['-ltilejit', '-ljansson'] + (['-lopenblas'] if have_openblas else []):
                if lib not in words:
                    bad.append('pkg-config --static --libs tilejit lacks %s: %s' % (lib, r.stdout.strip()))
    for b in bad:
        print('test_pkgconfig: ' + b, file=sys.stderr)
    print('%s: Requires.private %s; %d problem(s)' % (pc, ', '.join(requires), len(bad)))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
