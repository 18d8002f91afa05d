"""A rank's failure, remembered as its output streams by: the latest Python traceback's exception
and last frames, or a C++ abort's line; a few lines per rank whatever the traceback's depth.

    python -c "from simcluster.launcher.observe.failures import RankTrace as T; t = T(); \
[t.feed(x) for x in ('Traceback (most recent call last):', '  File \"a.py\", line 1', 'ValueError: x')]; print(t.lines())"

Rules (``Stream.tracebacks`` and the summary's FAILED lines follow them):

- A Python traceback starts at ``Traceback (most recent call last):`` and ends at the first
  exception line after it (``ValueError: boom``, ``torch.distributed.DistBackendError: ...``;
  EXCEPTION_LINE). Between them only indented lines count: a ``  File ...`` line starts a frame,
  the indented lines after it (its source line) belong to it, caret lines (``^^^^``, ``~~~^^``)
  are dropped; the rank's other output interleaved there is ignored.
- Only the last FRAMES_KEPT frames are kept (FRAME_LINES lines each), and the number of frames.
- A new ``Traceback`` line starts a new block (a chained exception, a later failure): the latest
  complete traceback is the one reported. A block cut short (no exception line yet) leaves the
  previous complete one reported, if any.
- A chain (``raise ... from ...``, or an exception raised while another was handled): Python prints
  the first exception's block, then CHAIN_LINE (``The above exception was the direct cause of the
  following exception:`` or ``During handling of the above exception, another exception
  occurred:``), then the next block. The reported block then opens with ``root cause: `` and the
  chain's first exception line (its root cause), whatever the chain's length; the last exception
  stays the last line.
- A rank with no complete Python traceback is reported by its last ``terminate called ...`` line
  (C++ std::terminate), if it printed one, joined with the ``what():`` line that follows it.
- ``failure_hint`` adds a fix where the cause is known: a module missing from the image, a known bug
  of torch itself (TORCH_BUGS: its exception line and, where given, a kept frame's line match; the
  hint names the bug and its upstream links, says that a GPU run fails the same way, and gives the
  workarounds; tests/test_torch_bugs.py fails the day torch fixes one), or torch.compile failing (its
  compiled code on a noexec folder, triton asking for a real GPU, no C++ compiler; otherwise how to
  run without compiling).
- PEER_FAILED / PEER_TIMEOUT tell, from the exception line, a rank that only saw a peer die (its
  connection closed) or timed out waiting for one; the summary names those after the cause.
"""
from __future__ import annotations

import collections
import dataclasses
import re

EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b")
# what a rank raises when a peer died first: named, but not as the cause
PEER_FAILED = re.compile(r"Connection closed by peer|remote worker crashing|Connection reset by peer|Broken pipe")
PEER_TIMEOUT = re.compile(r"[Tt]imed out waiting|DistNetworkError.*[Tt]imeout")
CHAIN_LINE = re.compile(r"^(The above exception was the direct cause of the following exception|"
                        r"During handling of the above exception, another exception occurred):")
ROOT_CAUSE = "root cause: "  # the first line of a chained block's lines(): the chain's first exception
CXX_ABORT = re.compile(r"^terminate called (?:without an active exception|after throwing .*)")  # std::terminate
TRACEBACK_START = "Traceback (most recent call last)"
CARETS = re.compile(r"^\s*[\^~]+[\s\^~]*$")
FRAMES_KEPT = 2  # frames shown above the exception line
FRAME_LINES = 3  # lines kept of one frame (its File line and source lines)
MISSING = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
# modules only torch's CUDA wheels pull in (the image's CPU torch does not): the requirement that installs one
CUDA_WHEEL_ONLY = {"triton": "triton==3.9.0"}


def missing_module_hint(line: str) -> str | None:
    """The fix for a rank's ``ModuleNotFoundError`` line: a module only CUDA wheels pull in (triton, which
    torchtitan imports at start without declaring it) or any other, through ``--requirements``."""
    m = MISSING.search(line)
    if not m:
        return None
    name = m.group(1).split(".")[0]
    if name in CUDA_WHEEL_ONLY:
        return (f"{name}: torch's CUDA wheels install it, the image's CPU torch does not; add "
                f"{CUDA_WHEEL_ONLY[name]} to your --requirements file (it installs on CPU; a kernel it launches "
                f"on the simulated GPU is refused)")
    return f"{name}: not in the image; add the package that provides it to your --requirements file"


COMPILE_FAILED = re.compile(r"InductorError|BackendCompilerFailed|torch\._dynamo\.exc\.")
COMPILE_HINTS = (  # (what the exception line says, the hint): the first that matches
    ("failed to map segment from shared object",
     "torch.compile's inductor loads the code it builds from TORCHINDUCTOR_CACHE_DIR (and Triton from "
     "TRITON_CACHE_DIR), which must allow running code: the cluster sets RUN_DIR/compile-cache/NODE/; a value your "
     "--env or your program sets points at a noexec folder such as /tmp: drop it"),
    ("libcuda.so cannot found",
     "triton's NVIDIA driver was asked for a GPU: on the simulated GPUs inductor compiles CPU code, with "
     "TORCHINDUCTOR_TRITON_DISABLE_DEVICE_DETECTION=1 (the instruments set it unless your environment sets it "
     "otherwise); keep it 1, or run with --no-simulated-gpus"),
    ("C++ compiler", "inductor builds CPU kernels with a C++ compiler (g++), which this image lacks: use the "
                     "trainer image or one FROM it (--requirements), or a base image with g++"),
)


def compile_hint(line: str) -> str | None:
    """The fix for a rank's exception line from torch.compile (inductor or dynamo): a known cause's, else
    how to see whether the program runs without compiling; None for any other line."""
    if not COMPILE_FAILED.search(line):
        return None
    known = next((hint for cause, hint in COMPILE_HINTS if cause in line), None)
    return known or ("torch.compile failed; to see whether your program runs without it, turn its compile option "
                     "off, or pass --env TORCHDYNAMO_DISABLE=1 (every torch.compile then runs eagerly)")


@dataclasses.dataclass(frozen=True)
class TorchBug:
    """A bug of torch itself, known by the traceback it leaves: ``exception`` matches the exception line,
    ``frame`` (None: any) one of the last frames' lines; ``what`` it is and which torch has it, ``links``
    upstream (where it came in, the fix proposed), ``workarounds``. A GPU run fails the same way: only bugs
    in torch's device-independent code are listed (tests/test_torch_bugs.py reproduces each on the host)."""

    name: str
    exception: re.Pattern
    frame: re.Pattern | None
    what: str
    links: str
    workarounds: str

    def hint(self) -> str:
        """The summary's line: the bug named with its links, a GPU's outcome, the workarounds."""
        return (f"torch bug, not the simulation's: {self.what} ({self.links}); a GPU run fails the same way; "
                f"workarounds: {self.workarounds}")


TORCH_BUGS = (
    TorchBug(name="tp-compile-act-grad",
             exception=re.compile(r"^AttributeError: 'Tensor' object has no attribute '_local_tensor'"),
             frame=re.compile(r"torch/distributed/tensor/_redistribute\.py"),
             what="torch 2.13's AOT autograd unwraps an AsyncCollectiveTensor input of a compiled region "
                  "(tensor parallel's output, e.g. the embedding's, entering a torch.compile'd block) with "
                  "trigger_wait(), which drops its requires_grad: the backward then hands DTensor's redistribute a "
                  "plain tensor; with FSDP2 beside TP nothing fails and that input's producer (the embedding) "
                  "gets a zero gradient",
             links="introduced by https://github.com/pytorch/pytorch/pull/179849; a fix proposed in "
                   "https://github.com/pytorch/pytorch/pull/191113",
             workarounds="run the TP model uncompiled (torchtitan: no --compile.enable), or compile without TP "
                         "(tensor parallel degree 1), or pass a plain tensor into the first compiled block (an op "
                         "on the embedding's output, e.g. .clone()); no torch._dynamo or torch._functorch config "
                         "switch turns it off"),
)


def torch_bug(lines: list[str]) -> TorchBug | None:
    """The entry of TORCH_BUGS a rank's failure (its traceback's lines, the exception last) matches, or None."""
    for bug in TORCH_BUGS:
        if bug.exception.search(lines[-1]) and (bug.frame is None or any(bug.frame.search(x) for x in lines[:-1])):
            return bug
    return None


def failure_hint(lines: list[str]) -> str | None:
    """The hint of a rank's failure (its traceback's lines, the exception last): a missing module's
    fix, a known torch bug's (TORCH_BUGS), a torch.compile failure's, or None."""
    if not lines:
        return None
    bug = torch_bug(lines)
    return missing_module_hint(lines[-1]) or (bug.hint() if bug else None) or compile_hint(lines[-1])


class RankTrace:
    """One rank's lines fed in order (without the ``[rankR]:`` prefix); ``lines()`` is its failure."""

    def __init__(self) -> None:
        self.frames: collections.deque[list[str]] | None = None  # the open block's last frames; None: no block
        self.depth = 0  # File frames of the open block
        self.done: tuple[list[list[str]], int, str] | None = None  # the latest complete one: frames, depth, exception
        self.root: str | None = None  # the first exception of the chain the latest complete block ends
        self.chained = False  # a chain line came after the latest complete block: the next block continues it
        self.block_chained = False  # the open block continues a chain
        self.abort: str | None = None  # the last "terminate called ..." line

    def feed(self, text: str) -> None:
        if text.startswith(TRACEBACK_START):
            self.frames, self.depth = collections.deque(maxlen=FRAMES_KEPT), 0
            self.block_chained, self.chained = self.chained and self.done is not None, False
        elif CXX_ABORT.match(text):
            self.abort = text
        elif self.abort and self.abort.startswith("terminate called after") and text.lstrip().startswith("what():") \
                and "what():" not in self.abort:  # the exception's own message, on the next line
            self.abort = f"{self.abort}: {text.strip().removeprefix('what():').strip()}"
        elif self.frames is None:
            self.chained = self.chained or (self.done is not None and bool(CHAIN_LINE.match(text)))
            return
        elif EXCEPTION_LINE.match(text):
            self.root = self.root if self.block_chained else text
            self.done = (list(self.frames), self.depth, text)
            self.frames = None
        elif text.startswith(" ") and not CARETS.match(text):
            if text.lstrip().startswith('File "') or not self.frames:
                self.frames.append([])
                self.depth += text.lstrip().startswith('File "')
            if len(self.frames[-1]) < FRAME_LINES:
                self.frames[-1].append(text)

    def lines(self) -> list[str] | None:
        """The lines to show, the last one the exception (or abort) line: ``root cause: ...`` when
        that exception ended a chain, ``... N earlier frames`` when frames were left out, then the
        last frames' lines; None when the rank printed neither."""
        if self.done is None:
            return [self.abort] if self.abort else None
        frames, depth, exception = self.done
        earlier = depth - sum(1 for f in frames if f and f[0].lstrip().startswith('File "'))
        head = [f"{ROOT_CAUSE}{self.root}"] if self.root and self.root != exception else []
        head += [f"... {earlier} earlier frame{'s' if earlier != 1 else ''}"] if earlier > 0 else []
        return head + [line for frame in frames for line in frame] + [exception]
