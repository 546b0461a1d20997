"""The test suite's stacks (tests/stacks.toml): one venv per integration or driven peer, built on
demand and cached by a hash of what goes in it and the Python it runs on.

Used three ways, with the standard library only (it runs before any venv exists):

* by ``scripts/test.py`` (``./scripts/test.sh``), which builds the stacks a selection of tests
  needs and runs pytest in each;
* by tests that start a stack's programs: :func:`require` gives the path of its venv, or skips
  (fails where ``LOOPSCOPE_REQUIRE_STACKS=1``, as under CI) when it is not built;
* by benchmarks and by hand: ``python tests/stacks.py build NAME...`` builds and prints the venvs.

A venv lives at ``.stacks/NAME``; ``.stacks/NAME/.stack-hash`` holds the hash it was built from, so
an unchanged stack costs one file read. uv builds them when the core venv has it (seconds from its
cache, all downloads in parallel; their bytecode compiled at install, as pip does, so that no child
process compiles them again); otherwise ``python -m venv`` and pip.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the core venv's test extras bring tomli
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "tests" / "stacks.toml"
HOME = ROOT / ".stacks"
# what a stack that runs tests gets beside its own requirements
TESTBASE = "testbase"
# bump to rebuild every stack (a change in how they are built)
BUILD_FORMAT = "2"


@dataclass(frozen=True)
class Stack:
    name: str
    extras: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    requirements: str | None = None
    loopscope: bool = True
    pin_core: tuple[str, ...] = ()
    runs: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    drives: tuple[str, ...] = ()
    again: bool = False
    python: str | None = None
    interpreter: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def folder(self) -> Path:
        return HOME / self.name

    @property
    def bin(self) -> Path:
        return self.folder / "bin"

    @property
    def executable(self) -> Path:
        return self.bin / "python"

    def all_extras(self) -> tuple[str, ...]:
        return (*((TESTBASE,) if self.runs else ()), *self.extras)


_KEYS = {"extras", "requires", "requirements", "loopscope", "pin-core", "runs", "checks", "drives", "again", "python", "interpreter", "env"}


def load(manifest: Path = MANIFEST) -> dict[str, Stack]:
    """Every stack of the manifest, by name; a key it does not know is an error, not ignored."""
    with manifest.open("rb") as f:
        data = tomllib.load(f)
    stacks: dict[str, Stack] = {}
    for name, entry in data.get("stacks", {}).items():
        unknown = set(entry) - _KEYS
        if unknown:
            raise ValueError(f"{manifest.name}: stack {name!r} has unknown keys {sorted(unknown)}")
        for path in (*entry.get("runs", ()), *entry.get("drives", ())):
            if not (ROOT / path).exists() and not (ROOT / path).parent.is_dir():
                raise ValueError(f"{manifest.name}: stack {name!r} names {path}, whose folder does not exist")
        stacks[name] = Stack(
            name=name,
            extras=tuple(entry.get("extras", ())),
            requires=tuple(entry.get("requires", ())),
            requirements=entry.get("requirements"),
            loopscope=bool(entry.get("loopscope", True)),
            pin_core=tuple(data.get("pin-sets", {})[entry["pin-core"]]) if "pin-core" in entry else (),
            runs=tuple(entry.get("runs", ())),
            checks=tuple(entry.get("checks", ())),
            drives=tuple(entry.get("drives", ())),
            again=bool(entry.get("again", False)),
            python=entry.get("python"),
            interpreter=entry.get("interpreter"),
            env=dict(entry.get("env", {})),
        )
    return stacks


@dataclass(frozen=True)
class SystemPackage:
    name: str
    package: str
    binary: str
    tests: tuple[str, ...]


def load_system(manifest: Path = MANIFEST) -> dict[str, SystemPackage]:
    """The Debian packages of the manifest's ``[system.NAME]`` tables, by name."""
    with manifest.open("rb") as f:
        data = tomllib.load(f)
    return {name: SystemPackage(name, e["package"], e["binary"], tuple(e["tests"])) for name, e in data.get("system", {}).items()}


# -- what goes in a stack, and its hash ------------------------------------------------------------


def _core_versions(dists: tuple[str, ...]) -> list[str]:
    """``dist==version`` for each of ``dists`` the running interpreter (the core venv) has."""
    from importlib import metadata

    pins = []
    for dist in dists:
        try:
            pins.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    return pins


def install_arguments(stack: Stack) -> list[str]:
    """The arguments of ``pip install`` (or ``uv pip install``) that fill the stack's venv."""
    args: list[str] = []
    if stack.loopscope:
        extras = stack.all_extras()
        args += ["-e", f"{ROOT}[{','.join(extras)}]" if extras else str(ROOT)]
    if stack.requirements:
        args += ["-r", str(ROOT / stack.requirements)]
    args += list(stack.requires)
    args += _core_versions(stack.pin_core)
    return args


def base_python() -> str:
    """The interpreter stacks are made with: the one the core venv was made from."""
    return getattr(sys, "_base_executable", None) or sys.executable


def _version_key(folder: Path) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in folder.name.split("."))


@functools.cache
def find_interpreter(version: str) -> str | None:
    """A Python ``version`` ("3.10") on this machine: ``python3.10`` on PATH, else pyenv's newest
    ``3.10.x`` (the machines CI runs on have pyenv's; nothing is downloaded). Each is tried: a
    pyenv shim on PATH exists whether or not the version is selected."""
    candidates = [shutil.which(f"python{version}")]
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if root.is_dir():
        folders = [d for d in root.glob(f"{version}.*") if d.name.removeprefix(f"{version}.").isdigit()]
        candidates += [str(d / "bin" / f"python{version}") for d in sorted(folders, key=_version_key, reverse=True)]
    for candidate in candidates:
        if candidate and subprocess.run([candidate, "-c", ""], capture_output=True, check=False).returncode == 0:
            return candidate
    return None


def stack_python(stack: Stack) -> str | None:
    """The interpreter the stack's venv is made from: its own ``interpreter`` (None when this machine
    has none), else the core venv's."""
    return find_interpreter(stack.interpreter) if stack.interpreter else base_python()


@functools.cache
def _python_version(python: str) -> tuple[int, ...]:
    """The interpreter's version, asked once a process (every hash and check of a stack reads it)."""
    out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:3])"], capture_output=True, text=True, check=True)
    return tuple(int(p) for p in out.stdout.split())


def _loopscope_requirements(stack: Stack) -> list[str]:
    """What installing loopscope with the stack's extras asks for (pyproject.toml's dependencies and
    those extras, self-references followed): an edit elsewhere in pyproject.toml rebuilds nothing."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    optional = project.get("optional-dependencies", {})
    wanted, seen, out = list(stack.all_extras()), set(), list(project.get("dependencies", []))
    while wanted:
        extra = wanted.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in optional.get(extra, []):
            if requirement.replace(" ", "").startswith(f"{project['name']}["):
                wanted += requirement.split("[", 1)[1].split("]", 1)[0].split(",")
            else:
                out.append(requirement)
    return sorted(out)


def stack_hash(stack: Stack, python: str | None = None) -> str:
    """What the venv is built from: the stack's entry, the files it installs from (pyproject.toml for
    loopscope and its extras, its requirements file), the core pins and the Python version."""
    python = python or stack_python(stack) or base_python()
    parts = {
        "format": BUILD_FORMAT,
        "install": install_arguments(stack),
        "python": ".".join(map(str, _python_version(python))) + " " + python,
        "loopscope": _loopscope_requirements(stack) if stack.loopscope else [],
        "requirements": (ROOT / stack.requirements).read_text() if stack.requirements else "",
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def too_old(stack: Stack, python: str | None = None) -> str | None:
    """Why the stack cannot be built with the Pythons this machine has, or None."""
    if stack.interpreter and python is None and stack_python(stack) is None:
        return (f"stack {stack.name} runs on Python {stack.interpreter}, and this machine has none "
                f"(python{stack.interpreter} on PATH, or pyenv's {stack.interpreter}.x)")
    if not stack.python:
        return None
    want = tuple(int(p) for p in stack.python.split("."))
    have = _python_version(python or stack_python(stack) or base_python())
    if have[: len(want)] < want:
        return f"stack {stack.name} needs Python {stack.python}+, and the core venv's is {'.'.join(map(str, have))}"
    return None


def is_built(stack: Stack) -> bool:
    stamp = stack.folder / ".stack-hash"
    return stack.executable.exists() and stamp.exists() and stamp.read_text().strip() == stack_hash(stack)


# -- building ------------------------------------------------------------------------------------


def _uv() -> str | None:
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.exists() else shutil.which("uv")


class BuildError(RuntimeError):
    pass


def build(stack: Stack, *, say=print) -> Path:
    """Make the stack's venv if it is missing or stale; returns its folder. Serialised by a lock
    file, so two runs that need one stack build it once."""
    import fcntl

    if (why := too_old(stack)) is not None:
        raise BuildError(why)
    HOME.mkdir(exist_ok=True)
    with open(HOME / f".{stack.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built(stack):
            return stack.folder
        started = time.monotonic()
        want = stack_hash(stack)
        shutil.rmtree(stack.folder, ignore_errors=True)
        uv, python = _uv(), stack_python(stack) or base_python()
        log = HOME / f"{stack.name}.log"
        env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
               "VIRTUAL_ENV": str(stack.folder)}
        env.pop("PYTHONPATH", None)
        if uv:
            steps = [[uv, "venv", "--quiet", "--seed", "-p", python, str(stack.folder)],
                     [uv, "pip", "install", "--compile-bytecode", "--python", str(stack.executable), *install_arguments(stack)]]
        else:
            steps = [[python, "-m", "venv", str(stack.folder)],
                     [str(stack.executable), "-m", "pip", "install", *install_arguments(stack)]]
        say(f"building stack {stack.name} in {stack.folder.relative_to(ROOT)} ({'uv' if uv else 'pip'}; log: {log.relative_to(ROOT)})")
        with log.open("w") as out:
            for step in steps:
                out.write("$ " + " ".join(step) + "\n")
                out.flush()
                done = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, check=False)
                if done.returncode != 0:
                    tail = log.read_text().splitlines()[-25:]
                    raise BuildError(f"stack {stack.name}: {step[0]} {step[1]} failed ({done.returncode}):\n  " + "\n  ".join(tail))
        (stack.folder / ".stack-hash").write_text(want + "\n")
        say(f"stack {stack.name} ready in {time.monotonic() - started:.0f}s")
        return stack.folder


# -- for tests -----------------------------------------------------------------------------------


def require(name: str) -> Path:
    """The folder of stack ``name``'s venv, for a test that starts its programs. When it is not
    built, the test is skipped, saying how to build it, or fails where LOOPSCOPE_REQUIRE_STACKS=1
    (./scripts/test.sh sets it under CI, after building every stack the run needs)."""
    import pytest

    stack = load()[name]
    if is_built(stack):
        return stack.folder
    why = (f"stack {name} is not built ({stack.folder.relative_to(ROOT)}): ./scripts/test.sh builds it for the tests "
           f"that need it, or: python tests/stacks.py build {name}")
    if os.environ.get("LOOPSCOPE_REQUIRE_STACKS") == "1":
        pytest.fail(why)
    pytest.skip(why)


def current() -> str:
    """The stack this pytest run is in ("core" in the core venv)."""
    return os.environ.get("LOOPSCOPE_STACK", "core")


# -- which stacks a selection of tests needs ----------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def relative(path: str) -> str:
    """A test path as the manifest writes it (relative to the root, no node id, no trailing /).
    Cached: the conftest asks it of every collected test against every stack's paths (110,000
    calls, each resolving symbolic links on the disk, were half of a worker's collection)."""
    plain = path.split("::", 1)[0]
    p = Path(plain)
    p = p.resolve() if p.is_absolute() or p.exists() else (ROOT / p)
    try:
        return p.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return p.as_posix()


def inside(selected: str, path: str) -> bool:
    """Whether a selected test path is the manifest path ``path`` or lies in it."""
    a, b = relative(selected), path.rstrip("/")
    return a == b or a.startswith(b + "/")


def overlaps(selected: str, path: str) -> bool:
    """Whether a selected test path and a manifest path share tests (one holds the other)."""
    return inside(selected, path) or inside(path, relative(selected))


def owned(path: str, stacks: dict[str, Stack]) -> list[str]:
    """The stacks whose own (not `again`) runs hold the test file ``path``."""
    return [s.name for s in stacks.values() if not s.again and any(inside(path, r) for r in s.runs)]


_ADAPTER_STACKS = {"google_genai": "gemini"}  # a provider SDK's stack is named after its extra


def of_adapter(adapter: str) -> str:
    """The stack that tests an adapter in a venv of its own (``openai_agents`` -> ``openai-agents``,
    ``google_genai`` -> ``gemini``)."""
    return _ADAPTER_STACKS.get(adapter) or adapter.replace("_", "-")


def main(argv: list[str]) -> int:
    stacks = load()
    if argv[:1] == ["build"]:
        failed = 0
        for name in argv[1:] or list(stacks):
            try:
                print(build(stacks[name], say=lambda m: print(m, file=sys.stderr)))
            except BuildError as e:
                print(e, file=sys.stderr)
                failed = 1
        return failed
    if argv[:1] == ["list"]:
        for s in stacks.values():
            state = "built" if is_built(s) else "not built"
            print(f"{s.name:18} {state:9}  runs: {', '.join(s.runs) or '-'}  drives: {', '.join(s.drives) or '-'}")
        return 0
    print("usage: python tests/stacks.py build [NAME...] | list", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
