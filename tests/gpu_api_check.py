"""One rank with a simulated GPU answers issue 53's questions (run by tests/test_gpu_api.py in a
fresh interpreter with a rank's environment: LOCAL_WORLD_SIZE=4). Prints one JSON object.

    SIMCLUSTER_INSTRUMENT=1 RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=4 PYTHONPATH=launcher/instrument/boot:. python tests/gpu_api_check.py
"""
import io
import json
import sys
import zipfile

import torch

out = {}


def err(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


c = torch.cuda
out["count"], out["current"] = c.device_count(), c.current_device()
out["names"] = [c.get_device_properties(i).uuid[-1] for i in range(c.device_count())]
c.set_device(-1)  # a no-op on GPUs
out["after_minus_one"] = c.current_device()
out["name_7"], out["capability_7"] = err(lambda: c.get_device_name(7)), err(lambda: c.get_device_capability(7))
out["set_device_7"], out["with_device_7"] = err(lambda: c.set_device(7)), err(lambda: c.device(7).__enter__())
out["rng_state_7"] = err(lambda: c.get_rng_state(7))
model = torch.nn.Linear(3, 2).to(c.device_count() - 1)  # PyTorch's DDP tutorial: model.to(local_rank)
out["model_to_int"] = str(model.weight.device)
out["model_to_bad"] = err(lambda: torch.nn.Linear(3, 2).to(9))
out["tensor_to_kw"] = str(torch.ones(2).to(device=0, dtype=torch.float64).dtype)
out["generator"] = str(torch.Generator(device="cuda").device)
out["fftfreq"] = str(torch.fft.fftfreq(4, device="cuda").device)


@torch.jit.script
def scripted(n: int) -> torch.Tensor:
    return torch.zeros(n) + torch.ones(n)


def scripted_bad(n: int) -> torch.Tensor:
    return torch.zeros(n, device="cuda:9")


@torch.jit.script
def scripted_devices() -> int:  # torch.cuda's functions compile to cuda:: operators
    torch.cuda.set_device(1)
    torch.cuda.synchronize()
    with torch.cuda.device(0):
        inner = torch.cuda.current_device()
    out = torch.cuda.device_count() * 100 + inner * 10 + torch.cuda.current_device()
    torch.cuda.set_device(0)
    return out


@torch.jit.script
def scripted_on_cuda(n: int) -> torch.Tensor:  # a tensor made on cuda inside scripted code
    return torch.zeros(n, device="cuda") + torch.ones(n, device=torch.device("cuda:1"))


out["jit"] = scripted(3).tolist()
try:
    torch.jit.script(scripted_bad)(1)
except RuntimeError as e:  # TorchScript's error carries the CUDA error of the bad ordinal
    bad = "CUDA error: invalid device ordinal" in str(e)
out["jit_cuda"] = [scripted_on_cuda(2).tolist(), bad]
out["jit_devices"] = scripted_devices()


def moved(x: torch.Tensor, d: torch.device) -> torch.Tensor:  # Tensor.to / .cuda inside scripted code
    y = x.to("cuda") + x.cuda()
    if bool(y.sum() > 0):
        y = y.to(d, torch.float64)
    return y.to(device="cuda:1", dtype=torch.float32)


class Moved(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.cuda().to("cuda:0") * 2


def moved_bad(x: torch.Tensor) -> torch.Tensor:
    return x.to("cuda:9")


x = torch.ones(2, requires_grad=True)
y = torch.jit.script(moved)(x, torch.device("cuda", 1))
y.sum().backward()
try:
    torch.jit.script(moved_bad)(x)
except RuntimeError as e:
    bad = "CUDA error: invalid device ordinal" in str(e)
out["jit_moves"] = [y.tolist(), str(y.dtype), x.grad.tolist(), torch.jit.script(Moved())(torch.ones(2)).tolist(), bad]
saved = io.BytesIO()
torch.jit.save(torch.jit.script(Moved()), saved)  # the file calls torch's operators (loads on a GPU machine)
code = [zipfile.ZipFile(saved).read(n) for n in zipfile.ZipFile(saved).namelist() if n.endswith(".py")]
saved.seek(0)
out["jit_saved"] = [any(b"torch.cuda(" in c for c in code), any(b"simcluster" in c for c in code),
                    torch.jit.load(saved)(torch.ones(2)).tolist()]
import torch.distributed.optim  # noqa: E402,F401 - scripts functional optimizers at import

out["distributed_optim"] = True
gens = c.default_generators
out["generators"] = [len(gens), gens[0] is torch.default_generator]
c.manual_seed(11)
a = torch.randn(3, device="cuda")
c.manual_seed(11)
out["seed_repeats"] = torch.equal(a, torch.randn(3, device="cuda"))
state = c.get_rng_state()  # a Megatron-style CUDA RNG tracker: fork a seeded stream, restore the default
c.manual_seed(123)
tracked = c.get_rng_state()
c.set_rng_state(state)
with torch.random.fork_rng(devices=[c.current_device()]):
    c.set_rng_state(tracked)
    t1 = torch.randn(3, device="cuda")
after = torch.randn(3, device="cuda")
c.set_rng_state(state)
out["fork_rng"] = [torch.equal(after, torch.randn(3, device="cuda")), not torch.equal(t1, after)]
out["initial_seed"] = c.initial_seed()
if c.device_count() >= 2:  # one generator per device
    c.manual_seed_all(5)
    s0, s1 = c.get_rng_state(0), c.get_rng_state(1)
    d1 = torch.randn(3, device="cuda:1")
    c.manual_seed(7)  # the current device (0) only
    with torch.cuda.device(1):
        on_1 = torch.randn(3, device="cuda")
    c.set_rng_state(s1, 1)
    out["per_device"] = [torch.equal(c.get_rng_state(0), c.default_generators[0].get_state()),
                         c.initial_seed(), c.default_generators[1].initial_seed(),
                         torch.equal(d1, torch.randn(3, device="cuda:1")),  # set_rng_state(s, 1) replays device 1
                         not torch.equal(d1, on_1),  # device 1 went on from where its draw left it
                         torch.equal(torch.randn(3, device="cuda:0"), torch.randn(3, generator=torch.Generator().manual_seed(7)))]
json.dump(out, sys.stdout)
