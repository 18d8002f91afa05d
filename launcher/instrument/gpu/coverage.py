"""Every public name of ``torch.cuda`` (with ``.memory``, ``.amp``, ``.random``, ``.streams``),
``torch.backends.cuda``/``cudnn`` and ``torch.accelerator``, and what the simulated GPU does with it.

    python -m simcluster.launcher.instrument.gpu.coverage      # the counts against this torch's names

Verdicts: TORCH (simulated: torch's own function runs unchanged over the simulated bindings,
gpu/bindings.py), REPLACED (simulated: a function of gpu/device.py, streams.py, memory.py,
tensors.py or bindings.py stands in), REFUSED (a RuntimeError at first use naming the feature and
the program's way around it: ``install_refusals`` here, CUDA graphs in gpu/kernels.py) and NA (not
applicable: a type, an exception, a constant, a submodule whose names are listed on their own).
A public name is one of ``dir(module)`` without a leading underscore that is not an import from
outside torch (typing, os, ...). tests/test_gpu_api.py compares the table with ``public_names`` of
the installed torch, so a torch upgrade names each new or removed name.
"""
from __future__ import annotations

import importlib
import types

TORCH, REPLACED, REFUSED, NA = "torch", "replaced", "refused", "n/a"
SIMULATED = (TORCH, REPLACED)
MEMORY = ("memory_allocated max_memory_allocated memory_reserved max_memory_reserved memory_cached max_memory_cached "
          "memory_stats memory_summary reset_peak_memory_stats reset_max_memory_allocated reset_max_memory_cached "
          "reset_accumulated_memory_stats empty_cache mem_get_info set_per_process_memory_fraction "
          "get_per_process_memory_fraction memory_stats_as_nested_dict caching_allocator_alloc "
          "caching_allocator_delete")  # gpu/memory.py
HOST = "host_memory_stats host_memory_stats_as_nested_dict reset_peak_host_memory_stats reset_accumulated_host_memory_stats"
ALLOCATOR = ("CUDAPluggableAllocator MemPool caching_allocator_disabled caching_allocator_enable change_current_allocator "
             "memory_snapshot use_mem_pool")
NVML = "device_memory_used memory_usage utilization temperature power_draw clock_rate"
RNG = "get_rng_state get_rng_state_all initial_seed manual_seed manual_seed_all seed seed_all set_rng_state set_rng_state_all"
NO_SIM = "run with --no-simulated-gpus to see the program's CPU behaviour, or guard the call"
WHY = {  # refused feature -> (what it is, the program's way around it)
    "allocator": ("the CUDA caching allocator's own control (pools, pluggable allocators, snapshots)",
                  "leave allocator tuning out of the rehearsal (torch.cuda.memory_allocated and memory_stats answer)"),
    "nvml": ("NVML telemetry of a physical GPU (utilization, temperature, power, clocks)",
             "guard the telemetry with its option or try/except"),
    "handles": ("a raw CUDA runtime, cuBLAS or cuSOLVER handle, or an external stream pointer",
                "keep raw CUDA handles out of the rehearsed code path"),
    "nccl": ("direct NCCL calls of torch.cuda.nccl", "use torch.distributed collectives (nccl -> gloo here)"),
    "jiterator": ("a CUDA kernel compiled at run time by the jiterator", "use the eager torch ops it fuses"),
    "green": ("CUDA green contexts (SM partitions)", "run without green contexts"),
    "gds": ("GPUDirect Storage file reads into GPU memory", "read with torch.load / safetensors"),
    "tunable": ("TunableOp's GEMM tuning on the GPU", "leave TunableOp off (PYTORCH_TUNABLEOP_ENABLED unset)"),
    "graphs": ("CUDA graphs", "turn CUDA graph capture off in your program"),
    "cufft": ("the cuFFT plan cache", "leave the cuFFT plan cache at its defaults"),
}
TABLE = {  # module -> rows of (verdict, names, why: a sentence for TORCH/REPLACED/NA, a WHY key for REFUSED)
    "torch.cuda": [
        (TORCH, "is_available device_count current_device set_device device device_of get_device_name "
                "get_device_capability get_device_properties synchronize ipc_collect get_arch_list get_gencode_flags "
                "can_device_access_peer init is_initialized get_sync_debug_mode set_sync_debug_mode " + RNG,
         "torch's own Python over the simulated torch._C._cuda_* bindings (gpu/bindings.py)"),
        (TORCH, "list_gpu_processes amp random memory", "torch's own (list_gpu_processes: as on a host without nvidia-ml-py)"),
        (REPLACED, "default_generators", "one generator per visible device, the current one's the CPU default generator (gpu/bindings.py)"),
        (REPLACED, MEMORY, "gpu/memory.py"),
        (TORCH, HOST + " get_allocator_backend", "torch's own over gpu/bindings.py (host "
                                                                           "memory: none pinned, pin_memory returns the tensor)"),
        (REPLACED, "Stream Event StreamContext stream current_stream default_stream set_stream streams "
                   "is_current_stream_capturing", "gpu/streams.py: work is done when the call returns"),
        (REPLACED, "is_bf16_supported is_tf32_supported", "from the GPU model's capability (gpu/device.py)"),
        (REPLACED, "nvtx profiler", "no-ops: no profiler is attached, as on a GPU run without nsys"),
        (REPLACED, "BFloat16Storage BFloat16Tensor BoolStorage BoolTensor ByteStorage ByteTensor CharStorage "
                   "CharTensor ComplexDoubleStorage ComplexFloatStorage DoubleStorage DoubleTensor FloatStorage "
                   "FloatTensor HalfStorage HalfTensor IntStorage IntTensor LongStorage LongTensor ShortStorage "
                   "ShortTensor", "the legacy typed classes are the CPU ones (torch.FloatTensor...)"),
        (REFUSED, ALLOCATOR, "allocator"),
        (REFUSED, NVML, "nvml"),
        (REFUSED, "cudart check_error current_blas_handle current_solver_handle get_stream_from_external "
                  "ExternalStream", "handles"),
        (REFUSED, "nccl", "nccl"), (REFUSED, "jiterator", "jiterator"), (REFUSED, "GreenContext green_contexts", "green"),
        (REFUSED, "gds", "gds"), (REFUSED, "tunable", "tunable"),
        (REFUSED, "CUDAGraph graph graphs make_graphed_callables graph_pool_handle", "graphs"),
        (NA, "AcceleratorError CudaError DeferredCudaCallError OutOfMemoryError cudaStatus",
         "exception types and CUDA status codes, raised as torch raises them"),
        (NA, "DEVICE_REQUIREMENT PYTORCH_RELEASES_CODE_CC TYPE_CHECKING classproperty has_half has_magma sparse",
         "build constants and helpers; torch.cuda.sparse is an empty legacy module"),
    ],
    "torch.cuda.memory": [
        (REPLACED, MEMORY, "as torch.cuda's (gpu/memory.py)"),
        (TORCH, "is_initialized list_gpu_processes get_allocator_backend " + HOST,
         "as torch.cuda's"),
        (REFUSED, ALLOCATOR, "allocator"),
        (NA, "TYPE_CHECKING", "a typing constant"),
    ],
    "torch.cuda.amp": [
        (TORCH, "autocast GradScaler", "torch's own classes over torch.amp's, whose cuda forms are CPU autocast with "
                                       "the CUDA dtype and torch's CPU GradScaler (gpu/tensors.py)"),
        (TORCH, "custom_fwd custom_bwd amp_definitely_not_available", "torch's own over the simulated device"),
        (NA, "autocast_mode common grad_scaler", "submodules whose names are listed above"),
    ],
    "torch.cuda.random": [(TORCH, "current_device device_count is_initialized " + RNG, "as torch.cuda's"),
                          (NA, "Tensor", "the tensor type")],
    "torch.cuda.streams": [(REPLACED, "Stream Event", "gpu/streams.py"), (REFUSED, "ExternalStream", "handles")],
    "torch.backends.cuda": [
        (REPLACED, "is_built is_flash_attention_available", "True, as a CUDA build answers"),
        (TORCH, "allow_fp16_bf16_reduction_math_sdp fp16_bf16_reduction_math_sdp_allowed blas_workspace_size "
                "cublas_workspace_size cublaslt_workspace_size cudnn_sdp_enabled enable_cudnn_sdp enable_flash_sdp "
                "enable_math_sdp enable_mem_efficient_sdp flash_sdp_enabled math_sdp_enabled mem_efficient_sdp_enabled "
                "matmul preferred_blas_library preferred_linalg_library preferred_rocm_fa_library sdp_kernel "
                "is_ck_sdpa_available can_use_cudnn_attention can_use_efficient_attention can_use_flash_attention",
         "torch's own settings: kept as set; they choose among CUDA kernels, so the CPU kernels run"),
        (REFUSED, "cufft_plan_cache", "cufft"),
        (NA, "SDPAParams SDPBackend cuBLASModule cuFFTPlanCache cuFFTPlanCacheAttrContextProp cuFFTPlanCacheManager",
         "types"),
    ],
    "torch.backends.cudnn": [
        (TORCH, "allow_tf32 benchmark benchmark_limit deterministic enabled flags set_flags fp32_precision conv rnn "
                "is_acceptable", "torch's own settings, kept as set (is_acceptable: False, the tensors are CPU's)"),
        (REPLACED, "is_available version", "True and cuDNN 9.10's version, as a CUDA build answers"),
        (NA, "CUDNN_TENSOR_DTYPES ContextProp CudnnModule PropModule depthwise_kernel", "types and constants"),
    ],
    "torch.accelerator": [
        (REPLACED, "current_accelerator current_device_idx current_device_index current_stream device_count device_index "
                   "empty_cache empty_host_cache get_device_capability get_memory_info is_available max_memory_allocated "
                   "max_memory_reserved memory_allocated memory_reserved memory_stats reset_accumulated_memory_stats "
                   "reset_peak_memory_stats set_device_idx set_device_index set_stream synchronize memory",
         "the simulated CUDA device (gpu/device.py)"),
        (REFUSED, "Graph graphs", "graphs"),
    ],
}


def module(name: str):
    """The module ``name`` names; torch.backends.cudnn's own module (torch swaps in a PropModule)."""
    mod = importlib.import_module(name)
    return getattr(mod, "m", mod) if name == "torch.backends.cudnn" else mod


def public_names(name: str) -> set[str]:
    """The public names of module ``name`` in the installed torch (see the module's docstring)."""
    mod, out = module(name), set()
    names = set(dir(mod))
    if name == "torch.backends.cudnn":
        names |= set(vars(type(importlib.import_module(name))))
    for n in names:
        obj = getattr(mod, n, None)
        if n.startswith("_"):
            continue
        if isinstance(obj, types.ModuleType):
            if obj.__name__.startswith(name + "."):
                out.add(n)
            continue
        origin = getattr(obj, "__module__", None)
        if not (isinstance(origin, str) and not origin.startswith("torch")):
            out.add(n)
    return out


def verdicts(name: str) -> dict[str, tuple[str, str]]:
    """name -> (verdict, why) of module ``name``'s table; ValueError for a name listed twice."""
    out: dict[str, tuple[str, str]] = {}
    for verdict, names, why in TABLE[name]:
        for n in names.split():
            if n in out:
                raise ValueError(f"{name}.{n} is listed twice in coverage.TABLE")
            out[n] = (verdict, why)
    return out


def counts() -> dict[str, int]:
    """How many of the table's names have each verdict, over all its modules."""
    out = dict.fromkeys((TORCH, REPLACED, REFUSED, NA), 0)
    for name in TABLE:
        for verdict, _why in verdicts(name).values():
            out[verdict] += 1
    return out


def message(qualname: str, key: str) -> str:
    """The refusal of ``qualname`` (WHY[key]): what it needs, where it was called, the way around."""
    from simcluster.launcher.instrument.gpu.kernels import _caller
    what, fix = WHY[key]
    return (f"{qualname} needs {what}, which simcluster's simulated GPU does not have (its tensors live on the "
            f"CPU); called from {_caller()}. Fix: {fix}; {NO_SIM}.")


def _refuser(qualname: str, key: str):
    def refused(*_a, **_k):
        raise RuntimeError(message(qualname, key))
    return refused


def _refused_class(qualname: str, key: str) -> type:
    refused = _refuser(qualname, key)
    def attr(_self_or_cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return refused()
    meta = type("Refused", (type,), {"__getattr__": attr})
    return meta(qualname.rsplit(".", 1)[-1], (), {"__init__": lambda self, *a, **k: refused(), "__getattr__": attr,
                                                   "__doc__": f"refused: {WHY[key][0]}"})


def install_refusals() -> None:
    """Refuse every REFUSED name of the table at its first use (a submodule: each of its public
    functions and classes); the rest of the table is installed by gpu/install.py's pieces."""
    for name, rows in TABLE.items():
        mod = module(name)
        for verdict, names, key in rows:
            for n in names.split() if verdict == REFUSED else ():
                obj = getattr(mod, n, None)
                if isinstance(obj, types.ModuleType):
                    for m in public_names(obj.__name__) if obj.__name__ in TABLE else _own_names(obj):
                        _refuse(obj, m, key)
                else:
                    _refuse(mod, n, key)


ANSWER = {  # names in refused submodules that answer as a GPU's (gpu/device.py install_extras): torch's own code asks
    "torch.cuda.nccl.version", "torch.cuda.nccl.is_available", "torch.cuda.graphs.is_current_stream_capturing",
    "torch.cuda.tunable.is_enabled", "torch.cuda.tunable.tuning_is_enabled", "torch.cuda.tunable.record_untuned_is_enabled"}


def _own_names(mod) -> list[str]:
    """A submodule's functions and classes: its own public ones and its __all__."""
    names = [n for n, v in vars(mod).items() if not n.startswith("_") and callable(v)
             and getattr(v, "__module__", None) == mod.__name__]
    names += [n for n in getattr(mod, "__all__", ()) if n not in names and callable(getattr(mod, n, None))]
    return [n for n in names if f"{mod.__name__}.{n}" not in ANSWER]


def _refuse(owner, n: str, key: str) -> None:
    qualname, obj = f"{owner.__name__}.{n}", getattr(owner, n, None)
    if isinstance(obj, type):
        setattr(owner, n, _refused_class(qualname, key))
    elif callable(obj):
        setattr(owner, n, _refuser(qualname, key))
    else:  # an object (a plan cache): any attribute refuses
        setattr(owner, n, _refused_class(qualname, key).__new__(_refused_class(qualname, key)))


if __name__ == "__main__":
    import torch
    for name in TABLE:
        have, listed = public_names(name), set(verdicts(name))
        print(f"{name}: {len(have)} names; new in torch {torch.__version__}: {sorted(have - listed) or 'none'}; "
              f"gone: {sorted(listed - have) or 'none'}")
    print(counts())
