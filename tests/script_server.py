"""Script runs without the seconds of a fresh interpreter: a fork server for the test process.

``run_script(argv, cwd, env, timeout)`` is a drop-in for ``subprocess.run([sys.executable, *argv],
capture_output=True, text=True, ...)``. The first call starts one server process per test process
(one per xdist worker); it imports torch, torch.distributed, timm, colossalai.booster, diffusers,
transformers and the package's trainers and samplers once, runs no op and starts no thread of its own.
Each run is a child forked from it that becomes the script's process as a fresh interpreter would be:

- its own process group, stdin from /dev/null, fd 1 and 2 on files (output written from C lands there
  too), the caller's working folder and environment (``os.environ`` replaced, so ``putenv`` too);
- ``sys.argv`` and ``sys.path`` as ``python`` sets them (``sys.path[0]`` the script's folder, ``-m``'s
  working folder or ``''`` for ``-c``, then ``PYTHONPATH``, then the interpreter's own entries);
- the warning filters of a fresh interpreter plus ``PYTHONWARNINGS``, torch's thread count from
  ``OMP_NUM_THREADS`` or the machine's default, ``PYTHONUNBUFFERED`` honoured;
- the script runs as ``__main__`` (``__file__`` absolute, ``sys.argv[0]`` as given; ``-m`` through
  ``runpy``) and its exit code is the process's: ``SystemExit``'s
  code, 1 after printing an uncaught exception's traceback (the server's own frames left out), and
  an uncaught ``KeyboardInterrupt`` ends it by SIGINT as Python does (return code -2); non-daemon
  threads are joined and ``atexit`` functions run before it exits.

The timeout kills the child's process group (its own children too) and raises
``subprocess.TimeoutExpired``. Where a fork cannot be what a fresh interpreter is, the call runs a
real subprocess instead: an interpreter option other than ``-m``/``-c`` (``-u``, ``-X ...``), or a
variable read at interpreter or library start-up (``PYTHONHASHSEED``, ``TORCH_*``, ``TRITON_*``, ...)
that differs from the server's. Tests that check a fresh interpreter on purpose (start-up warnings,
import side effects, start-up time) and runs that receive signals keep ``subprocess``.

The server ends when the test process ends (end of file on its stdin, or its parent's death).
"""

import atexit
import json
import locale
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What the entry scripts import after reading their config (train.py, train_video.py, sample.py,
# sample_video.py, scripts/, benchmarks/, python -m opendit_lite.*): seconds saved on every run.
PRELOAD = (
    "torch", "torch.distributed", "torch.utils.data", "timm", "colossalai.booster", "diffusers", "transformers",
    "opendit_lite", "opendit_lite.training.trainer", "opendit_lite.training.image", "opendit_lite.training.video",
    "opendit_lite.sampling", "opendit_lite.sampling.outputs", "opendit_lite.builders.image",
    "opendit_lite.families", "opendit_lite.data.video_csv", "opendit_lite.evaluate.run", "tqdm",
)

# Read when the interpreter or a preloaded library starts, so a forked child could not honour a new
# value: a request that changes one of these runs as a real subprocess.
STARTUP_VARIABLES = ("PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONDEVMODE", "PYTHONMALLOC", "PYTHONIOENCODING",
                     "PYTHONUTF8", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONHOME", "PYTHONFAULTHANDLER",
                     "PYTHONDONTWRITEBYTECODE", "LD_PRELOAD", "LD_LIBRARY_PATH")
STARTUP_PREFIXES = ("TORCH_", "TORCHINDUCTOR_", "TRITON_", "PYTORCH_JIT")


# ----------------------------------------------------------------------------------------------------
# The test process's side
# ----------------------------------------------------------------------------------------------------

class ServerDied(RuntimeError):
    pass


class _Client:
    """The server process of this test process and the pipe to it (one run at a time)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.proc: Optional[subprocess.Popen] = None
        self.env: Dict[str, str] = {}
        self.log = os.path.join(tempfile.gettempdir(), f"script_server_{os.getpid()}.log")

    @staticmethod
    def server_env() -> Dict[str, str]:
        return {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # the children apply the caller's

    def start(self) -> None:
        self.env = self.server_env()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.script_server"], cwd=ROOT, env=self.env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, bufsize=0)
        atexit.register(self.stop)
        if self._read_line(600) != "ready":
            raise ServerDied(f"the script server did not start:\n{self._log_tail()}")

    def stop(self) -> None:
        """End of file on the server's stdin ends it; its log goes with it."""
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None
        try:
            os.remove(self.log)
        except OSError:
            pass

    def _log_tail(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def _read_line(self, timeout: Optional[float]) -> Optional[str]:
        """One line from the server; None when ``timeout`` seconds pass first. The pipe is unbuffered
        (read byte by byte), so a line already read ahead cannot hide behind ``select``."""
        fd = self.proc.stdout.fileno()
        if timeout is not None and not select.select([fd], [], [], max(timeout, 0))[0]:
            return None
        line = self.proc.stdout.readline()
        if not line:
            raise ServerDied(f"the script server exited (code {self.proc.poll()}):\n{self._log_tail()}")
        return line.decode().strip()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def differs_at_startup(self, env: Dict[str, str]) -> Optional[str]:
        server = self.env if self.alive() else self.server_env()
        for name in sorted(set(env) | set(server)):
            if (name in STARTUP_VARIABLES or name.startswith(STARTUP_PREFIXES)) and env.get(name) != server.get(name):
                return name
        return None

    def run(self, argv: List[str], cwd: str, env: Dict[str, str], timeout: Optional[float]):
        with tempfile.TemporaryDirectory(prefix="script_run_") as folder:
            out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
            request = {"argv": argv, "cwd": cwd, "env": env, "stdout": out, "stderr": err}
            data = (json.dumps(request) + "\n").encode()
            while data:
                data = data[os.write(self.proc.stdin.fileno(), data):]
            pid = int(self._read_line(60))
            status = self._read_line(timeout)
            if status is None:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._read_line(60)
            output = [_decode(path) for path in (out, err)]
        if status is None:
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, output=output[0], stderr=output[1])
        return subprocess.CompletedProcess([sys.executable, *argv], int(status), *output)


def _decode(path: str) -> str:
    """The file's text as ``subprocess.run(text=True)`` gives a pipe's (locale encoding, universal newlines)."""
    with open(path, "rb") as f:
        data = f.read()
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


_client = _Client()


def _supported(argv: Sequence[str]) -> bool:
    return bool(argv) and (not argv[0].startswith("-") or (argv[0] in ("-m", "-c") and len(argv) >= 2))


def run_script(argv: Sequence[str], cwd: str = ROOT, env: Optional[Dict[str, str]] = None,
               timeout: Optional[float] = 300) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True,
    timeout=timeout)`` run by a child of the fork server (see the module's docstring)."""
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    cwd = os.path.abspath(str(cwd))
    if not os.path.isdir(cwd):
        raise FileNotFoundError(2, "No such file or directory", cwd)
    with _client.lock:
        if not _supported(argv) or _client.differs_at_startup(env):
            return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=timeout)
        if not _client.alive():
            _client.start()
        return _client.run(argv, cwd, env, timeout)


# ----------------------------------------------------------------------------------------------------
# The server's side
# ----------------------------------------------------------------------------------------------------

def _die_with_parent() -> None:
    """SIGKILL when the parent process dies (Linux; elsewhere the end of file on stdin ends the server)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _script_path(argv: List[str], cwd: str, env: Dict[str, str], base_path: List[str]) -> List[str]:
    """``sys.path`` as ``python`` builds it for ``argv`` in ``cwd`` with ``env``."""
    if argv[0] == "-c":
        first = ""
    elif argv[0] == "-m":
        first = cwd
    else:
        first = os.path.dirname(os.path.realpath(os.path.join(cwd, argv[0])))
    extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [first, *extra, *[p for p in base_path if p not in extra]]


def _print_uncaught(error: BaseException) -> None:
    """``sys.excepthook`` on ``error`` with its traceback from the script's first frame (without this
    module's and runpy's frames), as the interpreter prints an uncaught exception."""
    import runpy

    own = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}
    tb = error.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) in own:
        tb = tb.tb_next
    sys.excepthook(type(error), error.with_traceback(tb), tb)


def _run_main(argv: List[str]) -> int:
    """Runs ``argv`` (after the interpreter's name) as ``__main__``; its exit code."""
    import runpy

    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file in sys.argv[0]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            return 0
        if argv[0] == "-c":
            sys.argv, path, source = ["-c", *argv[2:]], None, argv[1]
        else:
            sys.argv, path = list(argv), os.path.abspath(argv[0])
            try:
                with open(path, "rb") as f:
                    source = f.read()
            except OSError as error:
                print(f"{sys.executable}: can't open file {path!r}: [Errno {error.errno}] {error.strerror}",
                      file=sys.stderr)
                return 2
        # __main__ as the interpreter makes it: __file__ absolute, sys.argv[0] as given
        module = type(sys)("__main__")
        module.__dict__.update(__builtins__=__builtins__, __spec__=None, __cached__=None)
        if path is not None:
            module.__file__ = path
        sys.modules["__main__"] = module
        exec(compile(source, path or "<string>", "exec"), module.__dict__)
        return 0
    except SystemExit as stop:
        return _system_exit_code(stop.code)
    except KeyboardInterrupt as interrupt:
        _print_uncaught(interrupt)
        return -signal.SIGINT
    except BaseException as error:  # noqa: B902 - what the interpreter prints for an uncaught exception
        _print_uncaught(error)
        return 1


def _system_exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _finish(code: int) -> None:
    """Ends the child as the interpreter ends: joins threads, runs atexit, flushes, exits (or dies by SIGINT)."""
    import atexit

    try:
        threading._shutdown()
    except BaseException:  # noqa: B902
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def _child(request: dict, protocol_fds: Sequence[int], fresh_filters: list, base_path: List[str],
           default_threads: int) -> None:
    os.setpgid(0, 0)
    _die_with_parent()
    for fd in protocol_fds:
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    env, argv = request["env"], request["argv"]
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if env.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)
    import warnings

    warnings.filters[:] = fresh_filters
    warnings._filters_mutated()
    if env.get("PYTHONWARNINGS"):
        warnings._processoptions([w for w in env["PYTHONWARNINGS"].split(",") if w])
    import torch

    try:
        threads = int(env.get("OMP_NUM_THREADS", ""))
    except ValueError:
        threads = 0
    torch.set_num_threads(threads if threads > 0 else default_threads)
    sys.path[:] = _script_path(argv, request["cwd"], env, base_path)
    sys.argv = list(argv)
    from opendit_lite.utils.quiet import quiet_third_party_startup

    quiet_third_party_startup()  # as `import opendit_lite` does in a fresh interpreter
    _finish(_run_main(argv))


def serve() -> None:
    """The server: preloads, says ``ready``, then one fork per request line on stdin."""
    _die_with_parent()
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)  # nothing the preloaded modules print can reach the protocol
    import warnings

    fresh_filters = list(warnings.filters)
    base_path = [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    import importlib

    # torch's thread count in a fresh interpreter without OMP_NUM_THREADS (the server may have one, e.g. the
    # test workers' 1): asked of one, meanwhile
    fresh_threads = None
    if "OMP_NUM_THREADS" in os.environ:
        fresh_threads = subprocess.Popen(
            [sys.executable, "-c", "import torch; print(torch.get_num_threads())"], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})
    # torch.cuda.is_available() at an import asks the driver through NVML, so that a forked child can still
    # start CUDA (a CUDA context made before fork cannot be used after it)
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: B902 - an optional module missing only costs its import time
            print(f"script server: not preloaded {name}: {error!r}", file=sys.stderr)
    import torch

    default_threads = torch.get_num_threads()  # reads the setting, starts no thread
    if fresh_threads is not None:
        default_threads = int(fresh_threads.communicate()[0])
    if torch.cuda.is_initialized():
        print("script server: CUDA was initialised while preloading; children cannot use it", file=sys.stderr)
    warnings.simplefilter("ignore", DeprecationWarning)  # "this process is multi-threaded" (BLAS pools)
    reader = os.fdopen(requests, "rb")

    def reply(text: str) -> None:
        os.write(replies, (text + "\n").encode())

    reply("ready")
    for line in reader:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                _child(request, (requests, replies), fresh_filters, base_path, default_threads)
            except BaseException:  # noqa: B902 - the child could not become the script's process
                import traceback

                traceback.print_exc()
            finally:
                os._exit(70)
        reply(str(pid))
        try:
            _, status = os.waitpid(pid, 0)
        except BaseException:
            os.killpg(pid, signal.SIGKILL)
            raise
        reply(str(os.waitstatus_to_exitcode(status)))


if __name__ == "__main__":
    serve()
