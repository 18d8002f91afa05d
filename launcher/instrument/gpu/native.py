"""The simulated GPU's compiled allocator (gpu/counting_allocator.cpp): found, built, loaded.

    python -m simcluster.launcher.instrument.gpu.native --build              # build it for this torch (a user cache)
    python -m simcluster.launcher.instrument.gpu.native --build --out-dir D  # into D (images/Dockerfile: /opt/simcluster)

The library's file name carries a digest of its source and of torch's version
(``libsimcluster-alloc-<digest>.so``), so code mounted over an image (``--mount-code``) never loads a
library built from other source or for another torch. ``load`` looks in the image's folder
(IMAGE_DIR), then in the user cache (``$SIMCLUSTER_CACHE`` or ``~/.cache/simcluster``, ``native/``),
and builds it there with g++ when it is missing and a compiler is on PATH (2 s on a free core); it
returns None when no library can be had (then gpu/memory.py counts with its dispatch mode,
gpu/tracker.py). The library needs only torch's headers and libc10 (no Python headers): a plain
shared library called through ctypes.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "counting_allocator.cpp")
IMAGE_DIR = "/opt/simcluster"  # where images/Dockerfile builds it
STATS = ("allocated", "peak", "run_peak", "reserved", "peak_reserved", "total_allocated", "total_freed",
         "count", "peak_count", "total_count", "num_ooms")  # the order of the library's enum Stat


def _torch_dir() -> str:
    import torch
    return os.path.dirname(torch.__file__)


def lib_name() -> str:
    """The library's file name for this source and this torch."""
    import torch
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read() + torch.__version__.encode()).hexdigest()[:16]
    return f"libsimcluster-alloc-{digest}.so"


def cache_dir() -> str:
    """The user cache's folder for built libraries."""
    base = os.environ.get("SIMCLUSTER_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "simcluster")
    return os.path.join(base, "native")


def build(out_dir: str) -> str:
    """Compile the library into ``out_dir`` (atomically: concurrent builders each write their own
    file, the last rename wins). Raises RuntimeError naming the compiler's output when it fails and
    FileNotFoundError when no g++ is on PATH."""
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        raise FileNotFoundError("no C++ compiler (g++) on PATH")
    import torch
    os.makedirs(out_dir, exist_ok=True)
    target = os.path.join(out_dir, lib_name())
    tdir = _torch_dir()
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".build-", suffix=".so")
    os.close(fd)
    cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           "-I", os.path.join(tdir, "include"), SOURCE, "-o", tmp,
           "-L", os.path.join(tdir, "lib"), "-lc10", f"-Wl,-rpath,{os.path.join(tdir, 'lib')}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"building {target} failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target


def find(build_missing: bool = True) -> str | None:
    """The library's path: the image's, the cache's, or one built into the cache now; None if none."""
    name = lib_name()
    for folder in (IMAGE_DIR, cache_dir()):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    if not build_missing:
        return None
    try:
        return build(cache_dir())
    except (OSError, RuntimeError):
        return None


class NativeCounter:
    """The statistics of the compiled allocator, once it is torch's CPU allocator: attributes named
    as STATS (bytes, counts), read at each access; ``set`` writes one (peak resets, empty_cache)."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.simcluster_stat.restype = ctypes.c_int64
        lib.simcluster_stat.argtypes = [ctypes.c_int]
        lib.simcluster_set_stat.argtypes = [ctypes.c_int, ctypes.c_int64]
        lib.simcluster_set_limit.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
        lib.simcluster_set_device.argtypes = [ctypes.c_int]
        lib.simcluster_install.argtypes = [ctypes.c_int64]
        lib.simcluster_set_making.argtypes = [ctypes.c_int]
        lib.simcluster_device_of.argtypes = [ctypes.c_void_p]
        lib.simcluster_device_of.restype = ctypes.c_int
        self.set_making = lib.simcluster_set_making  # the mark of this thread's next allocations (gpu/devcheck.py)
        self.device_of = lib.simcluster_device_of  # a block's mark: 0 unknown, 1 cpu, 2 cuda

    def __getattr__(self, name: str) -> int:
        if name in STATS:
            return self.lib.simcluster_stat(STATS.index(name))
        raise AttributeError(name)

    def set(self, name: str, value: int) -> None:
        self.lib.simcluster_set_stat(STATS.index(name), int(value))

    def set_limit(self, total: int, limit: int, fraction_set: bool) -> None:
        """The device's capacity (bytes), the most bytes allocated at once (0: no limit), and whether
        a fraction set it (CUDA's message then says "X allowed")."""
        self.lib.simcluster_set_limit(int(total), int(limit), int(fraction_set))

    def set_device(self, index: int) -> None:
        """The device the out-of-memory message names."""
        self.lib.simcluster_set_device(int(index))


def load(total: int) -> NativeCounter | None:
    """Load the library and make it torch's CPU allocator for a device of ``total`` bytes; None
    when no library can be had or another allocator keeps the place."""
    path = find()
    if path is None:
        return None
    lib = ctypes.CDLL(path)
    counter = NativeCounter(lib)
    return counter if lib.simcluster_install(int(total)) == 1 else None


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m simcluster.launcher.instrument.gpu.native", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", action="store_true", help="build the library (else print where it is)")
    p.add_argument("--out-dir", default=None, help="folder to build into (default: the user cache)")
    args = p.parse_args(argv)
    if args.build:
        print(build(args.out_dir or cache_dir()))
        return 0
    path = find(build_missing=False)
    print(path or f"not built: {lib_name()} (python -m simcluster.launcher.instrument.gpu.native --build)")
    return 0 if path else 1


if __name__ == "__main__":
    sys.exit(main())
