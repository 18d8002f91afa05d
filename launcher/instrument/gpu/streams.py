"""The simulated device's streams and events: CPU work is done when the call returns, so a stream
only orders nothing and an event records the host's clock.

    python -c "from simcluster.launcher.instrument.gpu.streams import Event; a, b = Event(enable_timing=True), Event(enable_timing=True); a.record(); b.record(); print(a.elapsed_time(b) >= 0)"

``Event.elapsed_time`` is milliseconds between two ``record`` calls on the host's monotonic clock
(``time.perf_counter``): honest, since every CPU op has finished when it returns.
"""
from __future__ import annotations

import time


class Stream:
    """A simulated CUDA stream (``torch.cuda.Stream``): work on it runs at once, in program order.

    device: the local device index; priority: kept, as CUDA's (lower is higher)."""

    def __init__(self, device=None, priority: int = 0, **_kwargs):
        from simcluster.launcher.instrument.gpu.state import STATE
        self.device_index = STATE.index(device)
        self.priority = priority
        self.stream_id = id(self)

    @property
    def device(self):
        import torch
        return torch.device("cuda", self.device_index)

    def synchronize(self) -> None:
        """Nothing is pending: returns at once."""

    def wait_stream(self, stream) -> None:
        """Nothing is pending on ``stream``: returns at once."""

    def wait_event(self, event) -> None:
        """The event has happened: returns at once."""

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        """No CUDA graph is ever captured (gpu/kernels.py refuses them)."""
        return False

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def __eq__(self, other):
        return isinstance(other, Stream) and other.stream_id == self.stream_id

    def __hash__(self):
        return hash(self.stream_id)

    def __enter__(self):
        self._ctx = StreamContext(self)
        return self._ctx.__enter__()

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)

    def __repr__(self):
        return f"<simulated torch.cuda.Stream device=cuda:{self.device_index} id={self.stream_id:#x}>"


class Event:
    """A simulated CUDA event (``torch.cuda.Event``): ``record`` reads the host's clock."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False, **_kw):
        self.enable_timing = enable_timing
        self.time: float | None = None

    def record(self, stream=None) -> None:
        self.time = time.perf_counter()

    def wait(self, stream=None) -> None:
        """Recorded work is done: returns at once."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Recorded work is done: returns at once."""

    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds from this event's record to ``end_event``'s. Raises RuntimeError, as CUDA
        does, when either was made without ``enable_timing=True`` or has not been recorded."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.time is None or end_event.time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event.time - self.time) * 1e3


class StreamContext:
    """``torch.cuda.stream(s)``: makes ``s`` the current stream of its device inside the block."""

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        from simcluster.launcher.instrument.gpu.state import STATE
        if self.stream is None:
            return None
        self.prev = STATE.streams.get(self.stream.device_index)
        STATE.streams[self.stream.device_index] = self.stream
        return self.stream

    def __exit__(self, *exc):
        from simcluster.launcher.instrument.gpu.state import STATE
        if self.stream is not None:
            STATE.streams[self.stream.device_index] = self.prev
        return False
