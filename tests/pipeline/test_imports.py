"""Every subpackage and top-level module of opendit_lite imports alone, in a fresh interpreter:
no import cycle that works only by import order. One child process imports the heavy third-party
packages (torch, timm, Colossal-AI) once and forks once per module: each fork is fresh for
opendit_lite and far cheaper than a new interpreter."""

import os
import pkgutil
import subprocess
import sys

import opendit_lite

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = r"""
import importlib, os, sys, traceback, warnings
warnings.simplefilter("ignore")
import torch, timm, colossalai.booster  # noqa: F401,E401  (shared by the forks; opendit_lite is not imported)
assert not any(m.startswith("opendit_lite") for m in sys.modules)

failures = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
            if name == "opendit_lite.converter":  # the converter no longer pulls in sequence parallelism
                assert "opendit_lite.parallel" not in sys.modules, \
                    "opendit_lite.converter imports opendit_lite.parallel"
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        failures.append(name)
print("FAILED:" + ",".join(failures))
"""


def modules():
    return sorted(f"opendit_lite.{m.name}" for m in pkgutil.iter_modules(opendit_lite.__path__))


def test_every_subpackage_imports_alone():
    names = modules()
    assert {"opendit_lite.converter", "opendit_lite.parallel", "opendit_lite.parallelization",
            "opendit_lite.models", "opendit_lite.training"} <= set(names)
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *names], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "FAILED:", proc.stderr
