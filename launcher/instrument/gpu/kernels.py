"""What the simulated GPU cannot run, refused at its first use with the kernel's name and the way
to turn it off: CUDA graphs, float8 matmuls, Triton kernels, and flash-attn (a stand-in module).

    python -c "from simcluster.launcher.instrument.gpu.kernels import refusal; print(refusal('flash_attn_func', 'flash-attn', 'use your attention option for torch SDPA'))"

A CUDA kernel has no CPU twin, so each is refused with a RuntimeError, never run half-way:
``torch.cuda.CUDAGraph``/``graph``/``make_graphed_callables`` (CUDA graphs), ``torch._scaled_mm``
(float8 matmul on FP8 tensor cores), a Triton kernel launched (``triton.runtime.jit.JITFunction``).
torch.compile stays on inductor's CPU path: the simulated GPU's tensors are CPU tensors, but with
triton installed inductor would ask triton's NVIDIA driver for its hash because
``torch.cuda.is_available()`` is True, and the driver finds no libcuda (``AssertionError: libcuda.so
cannot found!``); so triton's device detection is off in the rank and in inductor's compile workers
(``TORCHINDUCTOR_TRITON_DISABLE_DEVICE_DETECTION=1``, inductor's own switch; a value the program's
environment sets wins). flash-attn installs only with CUDA: when the rank's code imports ``flash_attn`` and no real
package is found, a stand-in module imports (every attribute, every submodule), and its first
call raises, naming the function, where the program called it, and the portable path. To
``importlib.metadata`` the stand-in is an installed distribution (``flash_attn``, version
STANDIN_VERSION, its top-level modules), as packages probe an import name before using it.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import pathlib
import re
import sys
import traceback
import types

NO_TRITON_DEVICES = "TORCHINDUCTOR_TRITON_DISABLE_DEVICE_DETECTION"  # inductor's switch (torch/_inductor/config.py)
STANDIN = ("flash_attn", "flash_attn_interface", "flash_attn_2_cuda")  # top-level names a CUDA-only flash-attn provides
STANDIN_VERSION = "2.8.3+simcluster.standin"  # flash-attn's last 2.x release, marked as the stand-in


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/instrument/gpu/" not in frame.filename and "importlib" not in frame.filename:
            return f"{frame.filename}:{frame.lineno}"
    return "?"


def refusal(kernel: str, what: str, fix: str) -> str:
    """The message of a refused CUDA kernel: what it is, where it was called, how to turn it off."""
    return (f"{kernel} is a CUDA kernel ({what}) and cannot run on simcluster's simulated GPU (its tensors "
            f"live on the CPU); called from {_caller()}. Fix: {fix}, or run with --no-simulated-gpus to see "
            f"the program's CPU behaviour.")


class _Refused:
    """A stand-in callable (or class) of a CUDA-only package: raises at its first call."""

    def __init__(self, qualname: str):
        self.qualname = qualname

    def __call__(self, *args, **kwargs):
        raise RuntimeError(refusal(self.qualname, "flash-attn ships CUDA kernels only, so simcluster stands in "
                                   "an importable flash_attn that refuses each call",
                                   "switch your program to its portable attention path (its option for torch's "
                                   "F.scaled_dot_product_attention instead of flash-attn)"))

    def __mro_entries__(self, bases):  # `class X(flash_attn.Something)` builds; X() then refuses
        refused = self
        return (type(self.qualname.rsplit(".", 1)[-1], (), {"__init__": lambda s, *a, **k: refused()}),)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Refused(f"{self.qualname}.{name}")


class _StandIn(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Refused(f"{self.__name__}.{name}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        m = _StandIn(spec.name)
        m.__path__ = []
        m.__version__ = STANDIN_VERSION
        m.__simcluster_standin__ = True
        return m

    def exec_module(self, module):
        pass


class StandInDistribution(importlib.metadata.Distribution):
    """The stand-in as ``importlib.metadata`` sees an installed flash-attn: its name, version,
    summary and top-level modules (so ``version("flash_attn")`` and ``packages_distributions()``
    answer, as packages probe: transformers 5.9 looks its import name up in the latter)."""

    FILES = {"METADATA": f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {STANDIN_VERSION}\n"
                         "Summary: simcluster's stand-in of flash-attn: importable, each call refused\n",
             "top_level.txt": "\n".join(STANDIN) + "\n"}

    def read_text(self, filename):
        return self.FILES.get(filename)

    def locate_file(self, path):
        return pathlib.Path("/nonexistent/simcluster-standin") / path


class _Finder(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: answers only when no real flash_attn was found."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in STANDIN:
            return None
        return importlib.machinery.ModuleSpec(name, _Loader(), is_package=True)

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        """The stand-in's distribution, when asked for all or for flash-attn by any spelling, and no
        real flash-attn is installed (a real one's metadata comes first and wins)."""
        wanted = context.name is None or re.sub(r"[-_.]+", "-", context.name).lower() == "flash-attn"
        if not wanted or importlib.util.find_spec("flash_attn").loader.__class__ is not _Loader:
            return iter(())
        return iter((StandInDistribution(),))


def install_standins() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())


def install_kernels(torch) -> None:
    """Refuse CUDA graphs and float8 matmuls in ``torch``; Triton's launches once triton is imported."""
    from simcluster.launcher.instrument.gpu.tensors import _wrap
    from simcluster.launcher.instrument.lazy import when_imported

    def graphs(*_a, **_k):
        raise RuntimeError(refusal("CUDA graphs (torch.cuda.CUDAGraph)", "a captured CUDA stream replayed by the driver",
                                   "turn CUDA graph capture off in your program (e.g. torch.compile's mode "
                                   "'reduce-overhead' -> 'default', or its cuda-graphs option)"))

    class CUDAGraph:
        def __init__(self, *a, **k):
            graphs()

    torch.cuda.CUDAGraph, torch.cuda.graph, torch.cuda.make_graphed_callables = CUDAGraph, graphs, graphs
    if hasattr(torch.cuda, "graphs"):
        torch.cuda.graphs.CUDAGraph, torch.cuda.graphs.graph = CUDAGraph, graphs
        torch.cuda.graphs.make_graphed_callables = graphs

    def scaled_mm(fn):
        def wrapper(*a, **k):
            raise RuntimeError(refusal("torch._scaled_mm", "the float8 matmul of FP8 tensor cores",
                                       "train without float8 (don't convert the model with torchao.float8; "
                                       "torchtitan: leave 'float8' out of --model.converters)"))
        return wrapper
    _wrap(torch, "_scaled_mm", scaled_mm)

    def on_triton(jit) -> None:
        def run(fn):
            def wrapper(self, *a, **k):
                name = getattr(getattr(self, "fn", None), "__name__", "?")
                raise RuntimeError(refusal(f"the Triton kernel {name}", "Triton compiles it for a real GPU",
                                           "turn your program's Triton kernels off (its option for the eager "
                                           "torch path)"))
            return wrapper
        if hasattr(jit, "JITFunction"):
            _wrap(jit.JITFunction, "run", run)
    when_imported("triton.runtime.jit", on_triton)
    install_cpu_compile()


def install_cpu_compile() -> None:
    """Keep torch.compile on inductor's CPU path with triton installed (see the module's docstring):
    inductor's switch set in this rank's environment (its compile workers inherit it) and in its
    config once imported; a value the program's environment already holds is left as it is."""
    from simcluster.launcher.instrument.lazy import when_imported

    os.environ.setdefault(NO_TRITON_DEVICES, "1")
    if os.environ[NO_TRITON_DEVICES] == "1":
        when_imported("torch._inductor.config", lambda config: setattr(config, "triton_disable_device_detection", True))
