"""Task images with their own Python environment (tidal.sandbox.pyenv).

One env with pytest is built per session (the host's pip, from the package index this machine
is configured with). If it cannot be built (say the index is unreachable) every test here
fails with pip's message: they never skip for that.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading

import pytest

from tidal.sandbox import PythonEnv, Sandbox, SandboxError, TaskImage, build_python_env
from tidal.sandbox import pyenv
from test_sandbox import make_config, open_sandbox

PYTHON = "/usr/bin/python3"
"""One interpreter for both backends: as root the subprocess backend's fresh uid must reach
it (see test_sandbox.subprocess_python), and an env is built for one interpreter."""

TESTS = """\
def test_passes():
    assert 1 + 1 == 2

def test_fails():
    assert 1 + 1 == 3
"""
LAYOUTS = [("bwrap-warm", "overlay"), ("bwrap", "overlay"), ("subprocess-warm", "copy"),
           ("subprocess", "copy")]


@pytest.fixture(scope="session")
def cache_dir():
    """A cache every sandbox uid can traverse (not under /tmp: bwrap's /tmp is the workspace)."""
    if not os.path.exists(PYTHON):
        pytest.skip(f"{PYTHON} is not installed")
    path = tempfile.mkdtemp(prefix="tidal-test-envs-", dir="/var/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture(scope="session")
def env(cache_dir) -> PythonEnv:
    return build_python_env(["pytest"], PYTHON, cache_dir)


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda p: f"{p[0]}-{p[1]}")
def sandbox(request):
    backend, mode = request.param
    yield from open_sandbox(backend, mode, python=PYTHON, timeout_s=30.0, memory_mb=1024)


@pytest.fixture
def image(env):
    with TaskImage.from_files({"tests/test_app.py": TESTS, "app.py": "X = 1\n"},
                              python_env=env) as image:
        yield image


def test_pytest_runs_in_a_rollout(sandbox, image):
    with sandbox.rollout(image) as rollout:
        r = rollout.run_pytest(["-q", "tests/test_app.py"])
        assert r.exit_code == 1, r.stdout + r.stderr  # pytest: some tests failed
        assert "1 failed, 1 passed" in r.stdout, r.stdout + r.stderr
        assert "FAILED tests/test_app.py::test_fails" in r.stdout
        r = rollout.run_python("import pytest, app; print(pytest.__file__, app.X)")
        assert r.exit_code == 0, r.stderr
        assert r.stdout.startswith(image.python_env.site_packages) and r.stdout.endswith(" 1\n")
        r = rollout.run(["python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         "tests/test_app.py::test_passes"])
        assert (r.exit_code, "1 passed" in r.stdout) == (0, True), r.stdout + r.stderr
        assert "tests/__pycache__/test_app.cpython-311-pytest-9.2.0.pyc" not in rollout.files()


def test_the_env_cannot_be_written_from_inside(sandbox, image):
    env = image.python_env
    before = sorted(os.listdir(env.site_packages))
    targets = [os.path.join(env.site_packages, "planted.py"), os.path.join(env.path, "x"),
               os.path.join(env.site_packages, "pytest", "__init__.py"), env.python]
    program = "\n".join(f"try:\n    open({t!r}, 'a').write('PWNED')\n    print('WROTE')\n"
                        f"except OSError as e:\n    print('blocked', e.errno)" for t in targets)
    with sandbox.rollout(image) as rollout:
        r = rollout.run_python(program)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.count("blocked") == len(targets), r.stdout
    assert sorted(os.listdir(env.site_packages)) == before
    with open(os.path.join(env.site_packages, "pytest", "__init__.py")) as f:
        assert "PWNED" not in f.read()


def test_a_second_build_reuses_the_cache(env, cache_dir, monkeypatch):
    def no_build(*args):
        raise AssertionError("rebuilt an env that was already complete")

    monkeypatch.setattr(pyenv, "_build", no_build)
    assert build_python_env(["pytest"], PYTHON, cache_dir) == env
    assert os.path.isfile(os.path.join(env.path, pyenv.MARKER))
    mode = os.stat(env.site_packages).st_mode & 0o777
    assert mode == 0o755


def test_builds_at_once_make_one_env(cache_dir):
    results, errors = [], []

    def build():
        try:
            results.append(build_python_env([], PYTHON, cache_dir, ["--no-index"]))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert os.path.isfile(os.path.join(results[0].path, pyenv.MARKER))
    assert not [n for n in os.listdir(cache_dir) if n.startswith(".building-")]


def test_a_bad_package_is_one_clear_error(cache_dir):
    name = "tidal-no-such-package-zq7x"
    with pytest.raises(SandboxError, match=name) as info:
        build_python_env([name], PYTHON, cache_dir, ["--retries", "0", "--timeout", "10"])
    assert "pip exited" in str(info.value)
    assert not [n for n in os.listdir(cache_dir)
                if n.startswith(".building-") or (not n.endswith(".lock") and not
                                                  os.path.exists(os.path.join(cache_dir, n,
                                                                              pyenv.MARKER)))]


def test_sandbox_without_an_image_stays_stdlib_only(sandbox):
    r = sandbox.run_python("import pytest")
    assert r.exit_code == 1 and "ModuleNotFoundError" in r.stderr


def test_an_env_for_another_interpreter_is_refused(env):
    try:
        sandbox = Sandbox(make_config("bwrap", python=""))
    except SandboxError as e:
        pytest.skip(f"bwrap unusable here: {e}")
    if sandbox.python == os.path.realpath(PYTHON):
        pytest.skip("the default interpreter is the env's")
    with TaskImage.from_files({"a": "b"}, python_env=env) as image:
        with pytest.raises(SandboxError, match="was built for"):
            sandbox.rollout(image)


def test_an_env_the_fresh_uid_cannot_reach_is_refused(tmp_path):
    try:
        sandbox = Sandbox(make_config("subprocess", python=PYTHON))
    except SandboxError as e:
        pytest.skip(f"subprocess unusable here: {e}")
    if not sandbox._runner.drops_privileges:
        pytest.skip("runs here are not a fresh uid")
    private = tmp_path / "private"
    (private / "env").mkdir(parents=True)
    private.chmod(0o700)
    env = PythonEnv(str(private / "env"), PYTHON, str(private / "env" / "lib"), ())
    with TaskImage.from_files({"a": "b"}, python_env=env) as image:
        with pytest.raises(SandboxError, match="not traversable"):
            sandbox.rollout(image)
