"""TorchScript on the simulated GPU: the ``cuda::`` operators scripted code calls for ``torch.cuda``'s
functions, which only torch's CUDA builds register, answered by the simulated device.

    python -c "from simcluster.launcher.instrument.gpu.script import OPS; print([s for s, _ in OPS])"

TorchScript compiles ``torch.cuda.current_device()`` to the operator ``cuda::_current_device`` (and
``device_count``, ``set_device``, ``synchronize``, ``torch.cuda.device(i)``'s exchanges alike); a CPU
build has none, so scripted code calling them fails to compile ("Unknown builtin op"). Each is
defined here with torch.library and answered by torch.cuda's simulated function, so such code
compiles and runs.

A tensor made on ``cuda`` inside scripted code (``torch.zeros(3, device="cuda")``,
``device=torch.device("cuda:1")``, any factory): TorchScript hands the device to torch's C++ operator,
which the Python-level doors (gpu/tensors.py) never see, and the dispatcher sends the call to the CUDA
key, where a CPU build has no kernel. ``install_script_factories`` registers one boxed fallback for that
key (``torch.library.Library("_", "IMPL").fallback``): the call's cuda devices made cpu (the index
checked, gpu/tensors.py ``to_cpu``), the operator called again. Only calls that reach the CUDA key run
it (eager code's devices are cpu before dispatch): no cost per op.

``.to("cuda")``, ``.to(device, dtype)`` and ``.cuda()`` inside scripted code: TorchScript compiles them
to ``aten::to`` (its overloads that take a Device) and ``aten::cuda``, whose C++ asks for CUDA's
device guard before any kernel or dispatch key runs (``Cannot initialize CUDA without ATen_cuda
library``, ``PyTorch is not linked with support for cuda devices``): no fallback can answer. So each
such overload is defined again in the ``simcluster_gpu`` namespace with torch's own schema
(``torch._C._jit_get_schemas_for_operator``), implemented as torch's overload called with its
devices made cpu (the index checked), and ``install_script_moves`` has every graph TorchScript
compiles (``torch._C._jit_script_compile`` and its overloads' door for functions,
``torch.jit._recursive.create_script_module`` for modules, each method of each submodule) call
them instead (``retarget``), before its first run; ``torch.jit.load`` retargets what it loads, and a
scripted module or function saved (``save``, ``save_to_buffer``, so ``torch.jit.save``) is written
with torch's operators, so the file loads on a GPU machine. Only the scripted code's moves pay (one
Python call each); eager code is untouched.

A refusal of the simulated GPU inside scripted code (--check-devices' mixed devices, gpu/devcheck.py):
the check raises a Python exception under TorchScript's interpreter, which reports it as ``RuntimeError: ``
with no message (torch's C++ wrapper of a Python exception carries its text only once persisted), where a
GPU's interpreter carries CUDA's. ``refusal`` remembers the text it raises (this thread's last), and
``install_script_errors`` (with --check-devices only: one Python call per call of a scripted function or
method) puts it after that empty ``RuntimeError: `` of the interpreter's error, as a GPU's reads.
"""
from __future__ import annotations

import threading

OPS = (  # (schema in the cuda namespace, the torch.cuda function that answers it)
    ("_current_device() -> int", "current_device"),
    ("device_count() -> int", "device_count"),
    ("_set_device(int device) -> ()", "set_device"),
    ("_exchange_device(int device) -> int", "_exchange_device"),
    ("_maybe_exchange_device(int device) -> int", "_maybe_exchange_device"),
    ("synchronize() -> ()", "synchronize"),
    ("synchronize.device(Device? device) -> ()", "synchronize"),
    ("synchronize.int(int? val) -> ()", "synchronize"),
)
_LIB: list = []  # the torch.library.Library, kept alive (its registrations last while it does)
_FALLBACK: list = []  # the CUDA key's fallback library, kept alive
_REFUSED = threading.local()  # .text: the last refusal raised in this thread since its scripted call began
EMPTY = "RuntimeError: \n"  # how the interpreter's error ends for a Python exception raised under it: no text


def install_script_ops(torch) -> None:
    """Define and implement OPS once in this process (idempotent)."""
    if _LIB:
        return
    lib = torch.library.Library("cuda", "FRAGMENT")
    for schema, name in OPS:
        lib.define(schema)
        lib.impl(schema.split("(", 1)[0], _caller(torch, name), "CompositeExplicitAutograd")
    _LIB.append(lib)


def _caller(torch, name: str):
    def call(*args):
        return getattr(torch.cuda, name)(*args)
    return call


def _on_cpu(op, *args, **kwargs):
    """The CUDA key's fallback: ``op`` called again with its cuda devices made cpu."""
    from simcluster.launcher.instrument.gpu.tensors import to_cpu

    def cpu(a):
        return to_cpu(a) if type(a).__name__ == "device" else a
    return op(*(cpu(a) for a in args), **{k: cpu(v) for k, v in kwargs.items()})


def install_script_factories(torch) -> None:
    """Register ``_on_cpu`` as the CUDA dispatch key's fallback once in this process (idempotent)."""
    if _FALLBACK:
        return
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(_on_cpu, "CUDA")
    _FALLBACK.append(lib)


NS = "simcluster_gpu"  # the namespace of the scripted moves
MOVES = ("aten::to", "aten::cuda")  # TorchScript's Tensor.to / Tensor.cuda
_MOVES: dict = {}  # "aten::to.prim_Device" -> "simcluster_gpu::to", once defined
_MOVE_LIB: list = []  # their torch.library.Library, kept alive


def _mover(torch, name: str, schema, devices: list[int]):
    """The kernel of ``schema`` (an overload of MOVES; ``devices``: its Device arguments' positions): eager's
    doors where they take its arguments (``Tensor.cuda``, ``Tensor.to(device=, dtype=, ...)``: gpu/tensors.py
    maps the device and checks its index, --check-devices marks the copy), else torch's overload with its
    devices made cpu."""
    from simcluster.launcher.instrument.gpu.tensors import to_cpu
    op = getattr(getattr(torch.ops.aten, name.split("::")[1]), schema.overload_name or "default")
    names = [a.name for a in schema.arguments]

    def move(*args, **kwargs):
        if name == "aten::cuda":
            return args[0].cuda()
        given = {**dict(zip(names, args)), **kwargs}
        dtype = given.get("dtype")
        if given.get("layout") is None and given.get("pin_memory") is None and not isinstance(dtype, int):
            return args[0].to(device=given.get("device"), dtype=dtype, non_blocking=given.get("non_blocking", False),
                              copy=given.get("copy", False), memory_format=given.get("memory_format"))
        args = tuple(to_cpu(a) if i in devices and a is not None else a for i, a in enumerate(args))
        if kwargs.get("device") is not None:
            kwargs["device"] = to_cpu(kwargs["device"])
        return op(*args, **kwargs)
    return move


def define_moves(torch) -> dict:
    """Define MOVES' overloads that take a Device (and aten::cuda) in NS once; returns _MOVES."""
    if _MOVE_LIB:
        return _MOVES
    lib = torch.library.Library(NS, "DEF")
    for name in MOVES:
        for schema in torch._C._jit_get_schemas_for_operator(name):
            devices = [i for i, a in enumerate(schema.arguments) if "Device" in str(a.type)]
            if not devices and name != "aten::cuda":
                continue
            text = str(schema).split("::", 1)[1]
            lib.define(text)
            lib.impl(text.split("(", 1)[0], _mover(torch, name, schema, devices), "CompositeImplicitAutograd")
            _MOVES[str(schema).split("(", 1)[0]] = f"{NS}::{name.split('::')[1]}"
    _MOVE_LIB.append(lib)
    return _MOVES


def retarget(graph, block=None, back: bool = False) -> int:
    """Make each node of ``graph`` (and its blocks) that calls a move of _MOVES call NS's twin (``back``:
    each twin call torch's operator again); returns how many were changed."""
    changed = 0
    for node in list((block or graph).nodes()):
        for inner in node.blocks():
            changed += retarget(graph, inner, back)
        if back:
            twin = "aten::" + node.kind()[len(NS) + 2:] if node.kind().startswith(NS + "::") else None
        else:
            twin = _MOVES.get(node.schema().split("(", 1)[0]) if node.kind() in MOVES else None
        if twin is None:
            continue
        new = graph.create(twin, list(node.inputs()), 1)
        new.insertBefore(node)
        new.output().setType(node.output().type())
        node.output().replaceAllUsesWith(new.output())
        node.destroy()
        changed += 1
    return changed


def _graphs(torch, scripted) -> list:
    """The graphs of a scripted module (each method of each submodule) or function, and of every
    function TorchScript compiled in this process (the callees a saved module carries)."""
    graphs = [f.graph for f in torch.jit._state._python_cu.get_functions()]
    if hasattr(scripted, "modules"):
        graphs += [sub._c._get_method(name).graph for sub in scripted.modules() for name in sub._c._method_names()]
    elif hasattr(scripted, "graph"):
        graphs.append(scripted.graph)
    return graphs


def install_script_moves(torch) -> None:
    """Retarget every graph TorchScript compiles from now on, the moves defined at the first (a program that
    scripts nothing pays nothing at start-up); idempotent."""
    from simcluster.launcher.instrument.gpu.tensors import _wrap

    def compiled(fn):
        def wrapper(*args, **kwargs):
            out = fn(*args, **kwargs)
            define_moves(torch)
            retarget(out.graph)
            return out
        return wrapper

    def module(fn):
        def wrapper(*args, **kwargs):
            out = fn(*args, **kwargs)
            define_moves(torch)
            for graph in _graphs(torch, out):
                retarget(graph)
            return out
        return wrapper

    def saving(fn):  # a saved file calls torch's operators, so that it loads anywhere
        def wrapper(self, *args, **kwargs):
            graphs = _graphs(torch, self)
            for graph in graphs:
                retarget(graph, back=True)
            try:
                return fn(self, *args, **kwargs)
            finally:
                for graph in graphs:
                    retarget(graph)
        return wrapper

    _wrap(torch._C, "_jit_script_compile", compiled)
    _wrap(torch._C, "_jit_script_compile_overload", compiled)
    _wrap(torch.jit._recursive, "create_script_module", module)
    _wrap(torch.jit, "load", module)  # its methods; the functions of the file's own CompilationUnit:

    def imported(fn):
        def wrapper(cu, *args, **kwargs):
            out = fn(cu, *args, **kwargs)
            define_moves(torch)
            for function in cu.get_functions():
                retarget(function.graph)
            return out
        return wrapper

    _wrap(torch._C, "import_ir_module", imported)
    _wrap(torch._C, "import_ir_module_from_buffer", imported)
    for owner in (torch.jit.RecursiveScriptModule, torch.jit.ScriptFunction):
        _wrap(owner, "save", saving)
        _wrap(owner, "save_to_buffer", saving)


def refusal(text: str) -> RuntimeError:
    """The RuntimeError of a refusal of the simulated GPU (gpu/devcheck.py), its text remembered for a scripted
    call's error (install_script_errors)."""
    _REFUSED.text = text
    return RuntimeError(text)


def install_script_errors(torch) -> None:
    """Every call of a scripted function or method (torch._C.ScriptFunction, ScriptMethod): an error of the
    interpreter that ends with an empty ``RuntimeError: `` after a refusal in the call gets the refusal's text
    there (raised as the same type, the interpreter's lines kept); idempotent."""
    from simcluster.launcher.instrument.gpu.tensors import _wrap

    def call(fn):
        def wrapper(*args, **kwargs):
            _REFUSED.text = None
            try:
                return fn(*args, **kwargs)
            except RuntimeError as e:
                text, said = getattr(_REFUSED, "text", None), str(e)
                if text is None or not said.endswith(EMPTY):
                    raise
                raise type(e)(f"{said[:-1]}{text}\n").with_traceback(e.__traceback__) from None
        return wrapper

    for owner in (torch._C.ScriptFunction, torch._C.ScriptMethod):
        _wrap(owner, "__call__", call)
