"""The fork server of tests/script_server.py behaves as a fresh ``python`` would: exit codes, output
written from Python and from C, the caller's environment and folder, sys.argv and sys.path, torch's
thread count, a timeout, and the same result as a real subprocess for a small script."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.script_server import ROOT, run_script

SCRIPT = textwrap.dedent("""\
    import os, sys
    print("argv", sys.argv)
    print("file", __file__, "main", __name__)
    print("path0", sys.path[0])
    print("cwd", os.getcwd())
    print("var", os.environ.get("SCRIPT_SERVER_VAR"), "absent", "SCRIPT_SERVER_ABSENT" in os.environ)
    sys.stdout.flush()
    os.write(1, b"from C on stdout\\n")
    os.write(2, b"from C on stderr\\n")
    print("on stderr", file=sys.stderr)
    import helper  # a module next to the script, as python finds it
    print("helper", helper.VALUE)
    import torch
    print("threads", torch.get_num_threads(), "sum", float(torch.ones(64, 64).matmul(torch.ones(64, 64)).sum()))
    if len(sys.argv) > 1 and sys.argv[1] == "raise":
        raise ValueError("raised by the script")
    if len(sys.argv) > 1 and sys.argv[1] == "interrupt":
        raise KeyboardInterrupt
    if len(sys.argv) > 1 and sys.argv[1] == "message":
        sys.exit("a message")
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
""")


@pytest.fixture
def script(tmp_path):
    folder = tmp_path / "scripts"
    folder.mkdir()
    (folder / "helper.py").write_text("VALUE = 42\n")
    path = folder / "probe.py"
    path.write_text(SCRIPT)
    return str(path)


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "SCRIPT_SERVER_ABSENT"}
    env.update(extra)
    return env


@pytest.mark.parametrize("arg, code", [("0", 0), ("2", 2), ("3", 3), ("raise", 1), ("message", 1),
                                       ("interrupt", -2)])
def test_exit_codes_are_the_scripts(script, arg, code):
    proc = run_script([script, arg], env=_env(OMP_NUM_THREADS="1"))
    assert proc.returncode == code, proc.stderr
    if arg == "raise":
        assert proc.stderr.endswith("ValueError: raised by the script\n")
        assert 'File "' + script + '", line' in proc.stderr
        assert "script_server" not in proc.stderr and "runpy" not in proc.stderr  # the script's frames only
    if arg == "message":
        assert proc.stderr.endswith("a message\n")
    if arg == "interrupt":
        assert proc.stderr.endswith("KeyboardInterrupt\n")


def test_output_environment_folder_argv_and_path(script, tmp_path):
    env = _env(SCRIPT_SERVER_VAR="set by the caller", OMP_NUM_THREADS="1")
    proc = run_script([script, "0"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert f"argv {[script, '0']}" in lines
    assert f"file {script} main __main__" in lines
    assert f"path0 {os.path.dirname(script)}" in lines
    assert f"cwd {tmp_path}" in lines
    assert "var set by the caller absent False" in lines
    assert "from C on stdout" in lines and "helper 42" in lines
    assert "threads 1 sum 262144.0" in lines
    assert proc.stderr == "from C on stderr\non stderr\n"
    # the server's environment is not the child's
    assert "var None absent False" in run_script([script, "0"], env=_env()).stdout.splitlines()


def test_relative_script_module_and_code(tmp_path):
    (tmp_path / "rel.py").write_text("import sys; print(sys.argv[0], __file__)\n")
    proc = run_script(["rel.py"], cwd=tmp_path)
    assert proc.stdout == f"rel.py {tmp_path / 'rel.py'}\n"
    proc = run_script(["-c", "import sys; print(sys.argv, repr(sys.path[0])); sys.exit(4)", "x"])
    assert (proc.returncode, proc.stdout) == (4, "['-c', 'x'] ''\n")
    proc = run_script(["-m", "json.tool", "--help"])
    assert proc.returncode == 0 and "usage" in proc.stdout
    proc = run_script(["missing.py"], cwd=tmp_path)
    assert proc.returncode == 2 and "can't open file" in proc.stderr


def test_torch_threads_default_as_in_a_fresh_interpreter():
    code = "import torch; print(torch.get_num_threads())"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run_script(["-c", code], env=env).stdout == fresh.stdout
    assert run_script(["-c", code], env=dict(env, OMP_NUM_THREADS="2")).stdout == "2\n"


def test_warnings_filters_follow_the_callers_pythonwarnings():
    code = "import warnings; warnings.warn('visible?', UserWarning)"
    assert "visible?" in run_script(["-c", code], env=_env()).stderr
    assert run_script(["-c", code], env=_env(PYTHONWARNINGS="ignore")).stderr == ""


def test_timeout_kills_the_child_and_its_children(tmp_path):
    marker = tmp_path / "late"
    (tmp_path / "slow.py").write_text(textwrap.dedent(f"""\
        import subprocess, sys, time
        late = "import time; time.sleep(4); open({str(marker)!r}, 'w')"
        subprocess.Popen([sys.executable, "-c", late])
        print("started", flush=True)
        time.sleep(60)
    """))
    run_script(["-c", "pass"])  # the server started
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        run_script([str(tmp_path / "slow.py")], timeout=2)
    assert time.monotonic() - start < 20
    assert raised.value.output == "started\n"
    time.sleep(5)
    assert not marker.exists()  # the grandchild went with its parent's process group
    assert run_script(["-c", "print('next')"]).stdout == "next\n"  # the server serves on


def test_same_result_as_a_real_subprocess(script):
    env = _env(SCRIPT_SERVER_VAR="x", OMP_NUM_THREADS="1")
    for arg in ("0", "raise"):
        real = subprocess.run([sys.executable, script, arg], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
        served = run_script([script, arg], cwd=ROOT, env=env)
        assert (served.args, served.returncode, served.stdout, served.stderr) == \
            (real.args, real.returncode, real.stdout, real.stderr)


def test_start_up_options_run_a_real_subprocess():
    proc = run_script(["-X", "utf8", "-c", "import sys; print(sys.flags.utf8_mode)"])
    assert (proc.returncode, proc.stdout) == (0, "1\n")
    proc = run_script(["-c", "import sys; print(sys.flags.hash_randomization)"], env=_env(PYTHONHASHSEED="0"))
    assert proc.stdout == "0\n"


@pytest.mark.gpu
def test_a_child_can_use_cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    proc = run_script(["-c", "import torch; print(torch.ones(3, device='cuda').sum().item())"])
    assert (proc.returncode, proc.stdout) == (0, "3.0\n"), proc.stderr
