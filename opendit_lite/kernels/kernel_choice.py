"""Never slower than compile: on CUDA, each fused norm kernel is timed once per call signature against
``torch.compile`` of its torch path, and the faster one serves every later call with that signature.

A fused Triton kernel is not faster everywhere: at some shapes (a narrow feature axis, few rows, a
per-token modulation) inductor's generated kernel for the same torch code wins. So the first time a
wrapper (``fused_adaln``, ``gated_residual_adaln``, ``triton_layer_norm``) meets a signature on a CUDA
device in eager mode, it times both on clones of that call's inputs (forward, plus backward when the
call records gradients), keeps the faster, logs the choice once (logger ``opendit_lite.kernels``) and
caches it: in this process, and in the JSON file named by ``OPENDIT_KERNEL_CHOICE_CACHE`` when set
(read at first use, rewritten after each measurement, keyed by the device's name as well).

* A signature: the op, each argument's dtype, shape and whether it needs a gradient (or its value:
  eps, None), whether gradients are recorded, the device's name.
* Inside ``torch.compile`` no timing can run (the inputs are fake tensors) and shapes may be
  symbolic, so the graph reads, as a constant (``assume_constant_result``), the choice for the op,
  dtypes and arguments without shapes: the compiled torch path where it won at every shape measured
  eagerly, else the kernel (logged as not measured when nothing was). Running one step eagerly first
  measures every signature the model meets (``measured_eagerly``:
  ``torch.compiler.set_stance("force_eager")``); a compiled training run does so at its first step
  (``first_step_context``).
* Off CUDA nothing changes: the Triton interpreter (``TRITON_INTERPRET=1``, the CPU tests) always
  runs the kernel, and CPU timings are never taken. A call first met inside a CUDA graph capture
  takes the kernel unmeasured (nothing can be timed there).
* ``OPENDIT_KERNEL_CHOICE=fused`` always takes the kernel (the kernel tests do: they test the kernel),
  ``compiled`` always the torch path (compiled where the model is); the default ``measure`` chooses
  as above.

The choosing logic takes its timer as an argument (``ChoiceCache(timer=...)``), so that it is tested
on the CPU with a timer the test scripts.
"""

import contextlib
import dataclasses
import functools
import json
import logging
import os
import statistics
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import torch

from ..errors import ConfigError

LOG = logging.getLogger("opendit_lite.kernels")
ENV_MODE = "OPENDIT_KERNEL_CHOICE"
ENV_CACHE = "OPENDIT_KERNEL_CHOICE_CACHE"
MODES = ("measure", "fused", "compiled")

Timer = Callable[[Callable[[], object]], float]  # a callable run once per repeat -> milliseconds


@dataclasses.dataclass(frozen=True)
class Choice:
    """The provider serving a signature and the times it was chosen on (None: not measured)."""

    provider: str                    # "triton" or "compile"
    triton_ms: Optional[float]
    compile_ms: Optional[float]
    source: str                      # "measured", "file" or why it was not measured
    shapeless: Optional[str] = None  # the signature without shapes (what compiled graphs look up)


def dispatch_mode() -> str:
    mode = os.environ.get(ENV_MODE, "measure")
    if mode not in MODES:
        raise ConfigError(f"{ENV_MODE}={mode!r} is not one of {', '.join(MODES)}: 'measure' (default) times the "
                         f"fused kernel against torch.compile once per shape, 'fused' always takes the kernel, "
                         f"'compiled' always the torch path (compiled where the model is)")
    return mode


def cuda_timer(fn: Callable[[], object], rep_ms: float = 25.0, max_reps: int = 100) -> float:
    """Median device milliseconds of ``fn`` (CUDA events), after two warm-up calls (the first compiles)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    while len(times) < max_reps and (len(times) < 5 or sum(times) < rep_ms):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def describe(args: Sequence[object], shapes: bool = True) -> tuple:
    """What a signature holds of each argument: (dtype, shape, needs a gradient) of a tensor (without
    ``shapes``: its dtype and whether it needs a gradient), else its value. Plain Python values only, so
    that ``torch.compile`` can pass the shapeless form to ``_compiled_provider`` as a constant."""
    if shapes:
        return tuple((str(a.dtype), tuple(a.shape), a.requires_grad) if isinstance(a, torch.Tensor) else a
                     for a in args)
    return tuple((str(a.dtype), a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args)


@functools.lru_cache(maxsize=None)
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def signature_key(op: str, described: tuple, device_index: Optional[int], train: bool) -> str:
    """The cache key: ``fused_adaln train bf16[2,256,1152]g ... 1e-06 None on <device name>`` (``g``: needs a
    gradient; the device's name, so that a cache file carried to another GPU model does not apply)."""
    parts = []
    for a in described:
        if isinstance(a, tuple) and len(a) in (2, 3) and str(a[0]).startswith("torch."):
            dtype = a[0].replace("torch.", "").replace("bfloat16", "bf16").replace("float", "f")
            shape = ",".join(str(s) for s in a[1]) if len(a) == 3 else "*"
            parts.append(f"{dtype}[{shape}]{'g' if a[-1] else ''}")
        else:
            parts.append(repr(a))
    name = _device_name(device_index) if device_index is not None else "cpu"
    return f"{op} {'train' if train else 'infer'} {' '.join(parts)} on {name}"


class ChoiceCache:
    """Signature -> ``Choice``: measured once with ``timer``, kept, logged once, optionally saved to ``path``."""

    def __init__(self, timer: Optional[Timer] = None, path: Optional[str] = None):
        self.timer = timer or cuda_timer
        self.path = path
        self.choices: Dict[str, Choice] = {}
        self._logged = set()
        if path and os.path.isfile(path):
            with open(path) as f:
                for key, c in json.load(f).items():
                    self.choices[key] = Choice(c["provider"], c.get("triton_ms"), c.get("compile_ms"), "file",
                                               c.get("shapeless"))

    def lookup(self, key: str) -> Optional[Choice]:
        return self.choices.get(key)

    def choose(self, key: str, triton: Callable[[], object], compiled: Callable[[], object],
               shapeless: Optional[str] = None) -> Choice:
        """The cached choice for ``key``, else both candidates timed once and the faster kept (a tie
        keeps the kernel); ``shapeless``: the key without shapes, under which compiled graphs look it up."""
        if key in self.choices:
            return self.choices[key]
        triton_ms, compile_ms = self.timer(triton), self.timer(compiled)
        provider = "compile" if compile_ms < triton_ms else "triton"
        return self.remember(key, Choice(provider, round(triton_ms, 5), round(compile_ms, 5), "measured", shapeless))

    def measured_for(self, shapeless: str) -> List[str]:
        """The providers measured (or read from the file) for every shape of a shapeless signature."""
        return [c.provider for c in self.choices.values() if c.shapeless == shapeless and c.source in ("measured",
                                                                                                      "file")]

    def remember(self, key: str, choice: Choice) -> Choice:
        self.choices[key] = choice
        self.log(key, choice)
        if self.path and choice.source == "measured":
            saved = {k: dict(provider=c.provider, triton_ms=c.triton_ms, compile_ms=c.compile_ms, shapeless=c.shapeless)
                     for k, c in self.choices.items() if c.source in ("measured", "file")}
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            partial = f"{self.path}.{os.getpid()}.tmp"  # one per process: ranks may share the file
            with open(partial, "w") as f:
                json.dump(saved, f, indent=1, sort_keys=True)
            os.replace(partial, self.path)
        return choice

    def log(self, key: str, choice: Choice) -> None:
        if key in self._logged:
            return
        self._logged.add(key)
        if choice.source == "measured":
            LOG.info("kernel choice %s: triton %.4f ms, torch.compile %.4f ms -> %s", key, choice.triton_ms,
                     choice.compile_ms, choice.provider)
        else:
            LOG.info("kernel choice %s: %s (%s)", key, choice.provider, choice.source)


_CACHE: Optional[ChoiceCache] = None


def cache() -> ChoiceCache:
    """The process's cache (created at first use, reading ``OPENDIT_KERNEL_CHOICE_CACHE``)."""
    global _CACHE
    if _CACHE is None:
        _CACHE = ChoiceCache(path=os.environ.get(ENV_CACHE) or None)
    return _CACHE


def set_cache(new: Optional[ChoiceCache]) -> Optional[ChoiceCache]:
    """Replace the process's cache (None: a fresh one at next use); returns the previous one."""
    global _CACHE
    old, _CACHE = _CACHE, new
    _SERVED.clear()
    return old


# (op, train, device index, each argument's dtype, shape and requires_grad, or its value) -> what serves it:
# the per-call lookup, which builds no signature string (that is built once, on a miss).
_SERVED: Dict[tuple, Callable] = {}


def _call_key(op: str, train: bool, x: torch.Tensor, args: Sequence[object]) -> tuple:
    return (op, train, x.device.index, tuple((a.dtype, tuple(a.shape), a.requires_grad) if isinstance(a, torch.Tensor)
                                              else a for a in args))


def records_gradients(args: Sequence[object]) -> bool:
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


@torch.compiler.assume_constant_result
def _compiled_provider(op: str, shapeless: tuple, device_index: Optional[int], train: bool) -> str:
    """Inside torch.compile (a constant of the graph): shapes may be symbolic there, so the choice is per op,
    dtypes and arguments: the compiled torch path when it won at every shape measured for them, else the
    kernel (logged as not measured when none was)."""
    mode = dispatch_mode()
    if mode != "measure":
        return "triton" if mode == "fused" else "compile"
    key = signature_key(op, shapeless, device_index, train)
    measured = cache().measured_for(key)
    if not measured:
        cache().remember(key, Choice("triton", None, None, "not measured: first met inside torch.compile; run "
                                                           "one step eagerly first (measured_eagerly)"))
        return "triton"
    return "compile" if all(p == "compile" for p in measured) else "triton"


_COMPILED_REFERENCES: Dict[Callable, Callable] = {}


def compiled_reference(fn: Callable) -> Callable:
    """``torch.compile`` of a torch path, built once per function (one graph per signature, static shapes)."""
    if fn not in _COMPILED_REFERENCES:
        _COMPILED_REFERENCES[fn] = torch.compile(fn, dynamic=False)
    return _COMPILED_REFERENCES[fn]


def _step(fn: Callable, args: Sequence[object]) -> Callable[[], object]:
    """One call of ``fn`` on detached clones of ``args``, with its backward when they need gradients."""
    clones = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
    inputs = [a for a in clones if isinstance(a, torch.Tensor) and a.requires_grad]
    train = torch.is_grad_enabled() and bool(inputs)
    grads: list = []

    def run():
        with torch.set_grad_enabled(train):
            out = fn(*clones)
            outs = [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, torch.Tensor)]
            if train:
                if not grads:
                    grads.extend(torch.randn_like(o) for o in outs)
                torch.autograd.grad(outs, inputs, grads)
        return out

    return run


def _index(x: torch.Tensor) -> Optional[int]:
    return x.device.index if x.device.type == "cuda" else None


def chooses_on(x: torch.Tensor) -> bool:
    """Whether calls on tensors like ``x`` are timed and chosen: CUDA tensors only."""
    return x.device.type == "cuda"


def choose_kernel(op: str, triton_fn: Callable, torch_fn: Callable, args: Sequence[object]) -> Callable:
    """What serves this call, once ``triton_runs_on`` said the kernel can run: ``triton_fn``, or where
    ``torch.compile`` of the torch path measured faster, that compiled path (``torch_fn`` itself inside a
    compiled model, which compiles it anyway). Off CUDA: the kernel (see the module docstring)."""
    x = next(a for a in args if isinstance(a, torch.Tensor))
    if not chooses_on(x):
        return triton_fn
    train = records_gradients(args)
    if torch.compiler.is_compiling():
        compiled = _compiled_provider(op, describe(args, shapes=False), _index(x), train) == "triton"
        return triton_fn if compiled else torch_fn
    mode = dispatch_mode()
    if mode != "measure":
        return triton_fn if mode == "fused" else torch_fn
    call = _call_key(op, train, x, args)
    if call in _SERVED:
        return _SERVED[call]
    key = signature_key(op, describe(args), _index(x), train)
    choice = cache().lookup(key)
    if choice is None:
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return triton_fn  # nothing can be timed inside a CUDA graph capture: the kernel, measured at a later call
        # One graph of the reference per signature (past dynamo's recompile limit it would run eagerly), and
        # compiled for real even inside ``measured_eagerly`` (whose stance would run it eagerly).
        name = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
        limit = max(getattr(torch._dynamo.config, name), 64)
        with torch._dynamo.config.patch(**{name: limit}), torch.compiler.set_stance("default"):
            choice = cache().choose(key, _step(triton_fn, args), _step(compiled_reference(torch_fn), args),
                                    shapeless=signature_key(op, describe(args, shapes=False), _index(x), train))
    served = triton_fn if choice.provider == "triton" else compiled_reference(torch_fn)  # what was measured
    _SERVED[call] = served
    return served


def first_step_context(compiled: bool, device: torch.device):
    """What a training run's first step runs under: a compiled run on CUDA whose kernels are chosen by
    measuring (the default ``OPENDIT_KERNEL_CHOICE``) runs it eagerly (``measured_eagerly``), so every norm
    signature the model meets is timed before the compiled graphs are built and read the choices; anything
    else runs as it is (nothing is timed off CUDA, and eager runs measure at their first calls anyway)."""
    if compiled and device.type == "cuda" and dispatch_mode() == "measure":
        return measured_eagerly()
    return contextlib.nullcontext()


@contextlib.contextmanager
def measured_eagerly() -> Iterator[None]:
    """Run compiled code eagerly inside (``torch.compiler.set_stance("force_eager")``), so that one step
    measures every kernel signature it meets before the compiled graphs are built and read the choices."""
    with torch.compiler.set_stance("force_eager"):
        yield
