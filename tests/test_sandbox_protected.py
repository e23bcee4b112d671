"""Protected files of a task image, Rollout.files() and changed_protected.

An agent's program attacks a protected test file every way it can (overwrite, append, delete,
rename it or its directory, chmod, have tidal write it); the file must come through unchanged
on every layout, while the agent's other edits and deletions show in files().
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.sandbox import TRUNCATED, Sandbox, TaskImage, changed_protected
from tidal.sandbox.files import SYMLINK
from test_sandbox import open_sandbox
from test_sandbox_rollout import image_state

TEST = "def test_it():\n    import app\n    assert app.VALUE == 1\n"
FILES = {"tests/test_app.py": TEST, "app.py": "VALUE = 0\n", "README": "task\n",
         "src/lib/util.py": "X = 2\n", "src/keep.py": "K = 1\n"}
PROTECTED = ("tests/test_app.py",)
LAYOUTS = [("bwrap-warm", "overlay"), ("bwrap", "overlay"), ("bwrap-warm", "copy"),
           ("subprocess-warm", "copy")]

ATTACK = """
import os, shutil
p = "tests/test_app.py"
attempts = {
    "overwrite": lambda: open(p, "w").write("def test_it():\\n    pass\\n"),
    "append": lambda: open(p, "a").write("\\nassert True\\n"),
    "delete": lambda: os.remove(p),
    "rename": lambda: os.rename(p, "moved.py"),
    "replace": lambda: (open("fake.py", "w").write("x"), os.replace("fake.py", p)),
    "chmod": lambda: os.chmod(p, 0o666),
    "rename_dir": lambda: os.rename("tests", "tests_old"),
    "rmtree_dir": lambda: shutil.rmtree("tests"),
}
for name, attempt in attempts.items():
    try:
        attempt()
        print(name, "DID IT")
    except OSError as e:
        print(name, "blocked", e.errno)
open("app.py", "w").write("VALUE = 1\\n")
os.remove("README")
shutil.rmtree("src/lib")
open("new.txt", "wb").write(b"caf\\xc3\\xa9 \\xff")
os.symlink("/etc/passwd", "link")
"""


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda p: f"{p[0]}-{p[1]}")
def sandbox(request):
    yield from open_sandbox(*request.param)


@pytest.fixture
def image():
    with TaskImage.from_files(FILES, protected=PROTECTED) as image:
        yield image


def holds(sandbox: Sandbox, mode: str) -> None:
    if mode == "copy" and "user" not in sandbox.guarantees:
        pytest.xfail("copy workspaces protect by ownership: only with a uid of its own per run")


def test_a_protected_file_survives_every_attack(sandbox, image):
    with sandbox.rollout(image) as rollout:
        holds(sandbox, rollout.mode)
        r = rollout.run_python(ATTACK)
        assert r.exit_code == 0, r.stderr
        assert "DID IT" not in r.stdout, r.stdout
        r = rollout.run(["cat", "tests/test_app.py"], files={"tests/test_app.py": "hacked"})
        assert r.stdout == TEST and "cannot write tests/test_app.py" in r.stderr, r
        files = rollout.files()
    assert image_state(image) == FILES
    assert changed_protected(image, files) == []
    assert files["tests/test_app.py"] == TEST
    assert files["app.py"] == "VALUE = 1\n"  # the agent's own edit
    assert "README" not in files and "src/lib/util.py" not in files  # its deletions
    assert files["src/keep.py"] == "K = 1\n"
    assert files["new.txt"] == "café \ufffd"
    assert files["link"] == SYMLINK + "/etc/passwd"


def test_files_sees_a_deleted_and_refilled_dir_as_the_rollout_left_it(sandbox, image):
    with sandbox.rollout(image) as rollout:
        r = rollout.run(["sh", "-c", "rm -r src && mkdir src && echo new > src/only.py"])
        assert r.exit_code == 0, r.stderr
        files = rollout.files()
    assert sorted(k for k in files if k.startswith("src/")) == ["src/only.py"]
    assert files["src/only.py"] == "new\n"


def test_files_stops_at_max_bytes(sandbox, image):
    with sandbox.rollout(image) as rollout:
        files = rollout.files(max_bytes=20)
    assert TRUNCATED in files
    assert sum(len(v) for k, v in files.items() if k != TRUNCATED) <= 20


def test_changed_protected_names_changed_and_missing_files(image):
    assert changed_protected(image, dict(FILES)) == []
    assert changed_protected(image, {**FILES, "tests/test_app.py": TEST + "#"}) == list(PROTECTED)
    assert changed_protected(image, {"app.py": "x"}) == list(PROTECTED)


@pytest.mark.parametrize("bad", ["missing.py", "src", "../x"])
def test_protected_must_name_files_of_the_image(bad):
    with pytest.raises(ValueError):
        TaskImage.from_files(FILES, protected=[bad])


def test_a_task_dirs_history_and_caches_are_sealed_out_of_its_image(tmp_path):
    src = tmp_path / "repo"
    (src / ".git" / "objects").mkdir(parents=True)
    (src / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0cached fix")
    (src / ".mypy_cache").mkdir()
    (src / "pkg" / "mod.py").write_text("def f(x):\n    return x\n")
    with TaskImage.from_dir(str(src)) as image:
        kept = sorted(str(p.relative_to(image.path)) for p in Path(image.path).rglob("*"))
    assert kept == ["pkg", "pkg/mod.py"]
    with TaskImage.from_dir(str(src), keep_history=True) as image:
        assert (Path(image.path) / ".git" / "HEAD").is_file()
