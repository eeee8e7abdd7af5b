"""The container image, without Docker: the Dockerfile and .dockerignore checked statically, and
the image's build steps replayed in clean virtualenvs (wheel built with the pinned backend, the pinned
lock installed with ``--no-deps``, the wheel with its image extras against that lock alone, ``pip
check``, then the entrypoint commands run)."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.built_once import built_once

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
IMAGE_LOCK = REPO / "requirements" / "image.txt"
BUILD_LOCK = REPO / "requirements" / "build.txt"


def _image_extras() -> tuple[str, ...]:
    """requirements/lock.py's IMAGE_EXTRAS (read, not imported: requirements/ is not a package)."""
    tree = ast.parse((REPO / "requirements" / "lock.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "IMAGE_EXTRAS" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, tuple)
            return value
    raise AssertionError("requirements/lock.py defines no IMAGE_EXTRAS")


IMAGE_EXTRAS = _image_extras()  # the extras the image carries (operator, sidecar)
BUILD_TOOLS = re.compile(
    r"\b(apt-get|apt|apk|dnf|yum|gcc|g\+\+|cc|make|build-essential|git|curl|wget|hatchling|setuptools)\b"
)


# -- a small Dockerfile reader ---------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def instructions(text: str) -> Iterator[Instruction]:
    """Instructions with line continuations joined and comments dropped."""
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = (pending + stripped).strip()
        pending = ""
        keyword, _, args = whole.partition(" ")
        yield Instruction(keyword.upper(), args.strip(), start)


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, with ``${ARG}`` in FROM lines resolved."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for ins in instructions(text):
        if ins.keyword == "ARG" and not stages:
            name, _, default = ins.args.partition("=")
            args[name.strip()] = default.strip().strip('"')
        elif ins.keyword == "FROM":
            words = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), ins.args).split()
            words = [w for w in words if not w.startswith("--")]
            stages.append(Stage(words[0], words[2] if len(words) >= 3 and words[1].upper() == "AS" else None))
        elif stages:
            stages[-1].instructions.append(ins)
    return args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse(DOCKERFILE.read_text())[1]


def test_every_base_image_is_pinned_to_a_full_version(stages: list[Stage]) -> None:
    names = {s.name for s in stages if s.name}
    assert len(stages) >= 2, "the Dockerfile must be multi-stage (build, then a clean final stage)"
    for stage in stages:
        if stage.base in names:
            continue
        assert "@sha256:" in stage.base or ":" in stage.base, f"base image {stage.base!r} has no tag"
        image, _, tag = stage.base.partition("@")[0].rpartition(":")
        assert tag != "latest" and "latest" not in stage.base, f"base image {stage.base!r} uses latest"
        assert "@sha256:" in stage.base or re.search(r"\d+\.\d+\.\d+", tag), (
            f"base image {stage.base!r} is not pinned to a full version (major.minor.patch) or a digest"
        )
        assert "slim" in tag or "alpine" in tag or "distroless" in image, (
            f"base image {stage.base!r} is not slim"
        )
    assert ":latest" not in DOCKERFILE.read_text(), "no image may be referenced by its latest tag"


def test_base_image_is_pinned_by_digest_and_keeps_its_tag(stages: list[Stage]) -> None:
    """A tag can be re-pushed: the base is pinned by digest; the tag stays, for people and updates."""
    names = {s.name for s in stages if s.name}
    for stage in stages:
        if stage.base in names:
            continue
        image, _, digest = stage.base.partition("@")
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"base image {stage.base!r} has no sha256 digest"
        assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", image), (
            f"base image {stage.base!r}: keep the full tag next to the digest"
        )


def test_final_stage_runs_bucketq_as_an_unprivileged_numeric_user(stages: list[Stage]) -> None:
    final = stages[-1]
    users = final.all("USER")
    assert users, "the final stage sets no USER: the image would run as root"
    user = users[-1].args.split(":")[0]
    assert user.isdigit() and int(user) != 0, f"USER {users[-1].args!r} must be a non-root numeric uid"
    runs_after_user = [i for i in final.instructions if i.keyword == "RUN" and i.line > users[-1].line]
    assert not runs_after_user, "RUN after USER in the final stage"
    entrypoints = final.all("ENTRYPOINT")
    assert entrypoints, "the final stage has no ENTRYPOINT"
    assert entrypoints[-1].args.replace(" ", "") == '["bucketq"]', (
        f"ENTRYPOINT must be the bucketq CLI in exec form, got {entrypoints[-1].args}"
    )


def test_final_stage_has_no_build_tools_and_only_the_built_virtualenv(stages: list[Stage]) -> None:
    build, final = stages[:-1], stages[-1]
    assert final.base == stages[0].base, "the final stage must use the build stage's interpreter image"
    for ins in final.all("RUN"):
        assert not BUILD_TOOLS.search(ins.args), (
            f"line {ins.line}: build tooling in the final stage: {ins.args}"
        )
        assert "pip install" not in ins.args, f"line {ins.line}: installs packages in the final stage"
    copies = final.all("COPY") + final.all("ADD")
    assert copies, "the final stage copies nothing"
    for ins in copies:
        assert ins.keyword == "COPY" and "--from=" in ins.args, (
            f"line {ins.line}: the final stage may only copy the virtualenv from the build stage: {ins.args}"
        )
    build_runs = " ".join(i.args for s in build for i in s.all("RUN"))
    for lock in ("requirements/image.txt", "requirements/build.txt"):
        (install,) = [i.args for s in build for i in s.all("RUN") if f"-r {lock}" in i.args]
        assert re.search(rf"--require-hashes[^&]*-r {lock}", install), (
            f"{lock} must be installed with --require-hashes (a file not matching the lock fails the build)"
        )
    assert "-r requirements/image.txt" in build_runs and "--no-deps" in build_runs, (
        "the build stage must install exactly the pinned lock (--no-deps -r requirements/image.txt)"
    )
    assert "-r requirements/build.txt" in build_runs and "--no-build-isolation" in build_runs, (
        "the wheel must be built with the pinned backend (requirements/build.txt, --no-build-isolation)"
    )
    assert " check" in build_runs, "the build stage must prove the lock complete with pip check"
    wheel_target = f"bucketq[{','.join(IMAGE_EXTRAS)}]"
    assert wheel_target in build_runs and "--no-index" in build_runs, (
        f"the build stage must install {wheel_target} against the lock alone (--no-index), so that a "
        "dependency of an image extra missing from the lock fails the build"
    )


# -- the dependency locks ----------------------------------------------------------------------------


def read_hashed_lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 hashes) of a ``pip --require-hashes`` lock (backslash-continued)."""
    pins: dict[str, tuple[str, list[str]]] = {}
    text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    for number, entry in enumerate(text.replace("\\\n", " ").splitlines(), 1):
        if not entry.strip():
            continue
        match = re.fullmatch(
            r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)((?:\s+--hash=sha256:[0-9a-f]{64})*)\s*",
            entry.strip(),
        )
        assert match, (
            f"{path.name} entry {number}: {entry.strip()[:80]!r} is not name==version --hash=sha256:..."
        )
        pins[canonicalize_name(match[1])] = (match[2], re.findall(r"sha256:([0-9a-f]{64})", match[3]))
    return pins


def read_lock(path: Path) -> dict[str, str]:
    return {name: version for name, (version, _) in read_hashed_lock(path).items()}


@pytest.mark.parametrize("lock", [IMAGE_LOCK, BUILD_LOCK], ids=["image", "build"])
def test_every_pin_carries_its_hashes(lock: Path) -> None:
    """pip --require-hashes refuses a lock with an unhashed pin: the lock is checked here first."""
    pins = read_hashed_lock(lock)
    assert pins, f"{lock.name} pins nothing"
    for name, (version, hashes) in pins.items():
        assert hashes, f"{lock.name}: {name}=={version} has no --hash=sha256 (run make lock)"
        assert len(set(hashes)) == len(hashes), f"{lock.name}: {name} lists a hash twice"
    assert "--require-hashes" in lock.read_text().splitlines()[2], "the header says how the lock is used"


def test_hashed_lock_reader_rejects_unhashed_and_malformed_entries(tmp_path: Path) -> None:
    good = (
        "# header\nfoo==1.0 \\\n    --hash=sha256:" + "a" * 64 + " \\\n    --hash=sha256:" + "b" * 64 + "\n"
    )
    (tmp_path / "good.txt").write_text(good)
    assert read_hashed_lock(tmp_path / "good.txt") == {"foo": ("1.0", ["a" * 64, "b" * 64])}
    (tmp_path / "unhashed.txt").write_text("foo==1.0\n")
    assert read_hashed_lock(tmp_path / "unhashed.txt") == {"foo": ("1.0", [])}
    for bad in ("foo>=1.0\n", "foo==1.0 --hash=md5:abc\n", "foo==1.0 --hash=sha256:short\n"):
        (tmp_path / "bad.txt").write_text(bad)
        with pytest.raises(AssertionError, match="is not name==version"):
            read_hashed_lock(tmp_path / "bad.txt")


def check_satisfied(requirements: list[str], pins: dict[str, str], lock: str) -> None:
    for text in requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"python_version": "3.11", "extra": ""}):
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} ({text}) is missing from {lock}: run make lock"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{lock} pins {req.name}=={pins[name]}, outside {text}: run make lock"
        )


def test_image_lock_pins_every_runtime_dependency_and_no_dev_tools() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = read_lock(IMAGE_LOCK)
    wanted = list(project["dependencies"])
    for extra in IMAGE_EXTRAS:
        wanted += project["optional-dependencies"][extra]
    check_satisfied(wanted, pins, "requirements/image.txt")
    for dev in ("pytest", "mypy", "ruff", "moto", "hypothesis", "pyspark"):
        assert canonicalize_name(dev) not in pins, f"{dev} is a dev/Spark tool: it has no place in the image"


def test_build_lock_pins_the_build_backend() -> None:
    system = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]
    check_satisfied(list(system["requires"]), read_lock(BUILD_LOCK), "requirements/build.txt")


# -- .dockerignore -----------------------------------------------------------------------------------


def dockerignore_patterns() -> list[tuple[bool, str]]:
    patterns = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        patterns.append((negated, pattern))
    return patterns


def _match(pattern: str, path: str) -> bool:
    """Docker's pattern match: ``*`` within one path element, ``**`` across any number of them."""
    regex = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            regex += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            regex += ".*"
            i += 2
        elif pattern[i] == "*":
            regex += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            regex += "[^/]"
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            regex += pattern[i : end + 1]
            i = end + 1
        else:
            regex += re.escape(pattern[i])
            i += 1
    return re.fullmatch(regex, path) is not None


def excluded(path: str, patterns: list[tuple[bool, str]]) -> bool:
    """Whether Docker leaves ``path`` out of the build context (a pattern on a parent counts; last wins)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    result = False
    for negated, pattern in patterns:
        if any(_match(pattern, p) for p in prefixes):
            result = not negated
    return result


@pytest.mark.parametrize(
    "path",
    [
        "tests/engine/test_engine.py",
        "tests/ship/test_dockerfile.py",
        ".venv/bin/python",
        "venv/lib/x.py",
        "bucketq/.venv/x",
        ".git/HEAD",
        ".tools/bin/helm",
        "bucketq/__pycache__/app.cpython-311.pyc",
        "bucketq/core/app.pyc",
        ".pytest_cache/v/x",
        ".mypy_cache/3.11/x.json",
        ".hypothesis/examples/x",
        "dist/bucketq-0.1.0-py3-none-any.whl",
        "build/lib/x.py",
        "bench.json",
        ".env",
        "helm/bucketq/values.yaml",
    ],
)
def test_dockerignore_keeps_out(path: str) -> None:
    assert excluded(path, dockerignore_patterns()), f".dockerignore lets {path} into the build context"


def test_dockerignore_keeps_what_the_dockerfile_copies(stages: list[Stage]) -> None:
    patterns = dockerignore_patterns()
    sources: list[str] = []
    for stage in stages:
        for ins in stage.all("COPY"):
            if "--from=" in ins.args:
                continue
            words = [w for w in shlex.split(ins.args) if not w.startswith("--")]
            sources += words[:-1]
    assert sources, "the Dockerfile copies nothing from the build context"
    for source in sources:
        root = REPO / source
        assert root.exists(), f"COPY {source}: not in the repository"
        files = [root] if root.is_file() else [p for p in root.rglob("*.py") if "__pycache__" not in p.parts]
        assert files, f"COPY {source}: no files"
        for file in files:
            rel = file.relative_to(REPO).as_posix()
            assert not excluded(rel, patterns), f".dockerignore drops {rel}, which COPY {source} needs"
    for rel in ("bucketq/cli/app.py", "bucketq/operator/crds.py", "bucketq/sidecar/server.py"):
        assert not excluded(rel, patterns), f".dockerignore drops {rel}"


def test_dockerignore_matcher_follows_docker_semantics() -> None:
    patterns = [(False, "*"), (True, "src"), (False, "**/*.pyc")]
    assert excluded("tests/x.py", patterns)
    assert not excluded("src/a/b.py", patterns)
    assert excluded("src/a/b.pyc", patterns)
    assert _match("**/*.py[cod]", "c.pyo") and _match("**/*.py[cod]", "a/b/c.pyo")
    assert not _match("*", "a/b") and _match("a/*", "a/b")


# -- the image's build steps, replayed in clean virtualenvs -------------------------------------------


def _pip(target: Path, *args: str, cwd: Path) -> None:
    """pip of this interpreter, working on the ``target`` environment (as the Dockerfile does)."""
    cmd = [sys.executable, "-m", "pip", "--python", str(target), "--disable-pip-version-check", *args]
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, (
        f"{shlex.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )


def _clean_env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if not k.startswith(("BUCKETQ_", "AWS_", "PYTHON", "VIRTUAL_ENV"))
    } | {"NO_COLOR": "1"}


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv made exactly like the image's /opt/bucketq, from the committed locks (built once
    per run, whichever xdist workers run the tests that use it: it takes ~16 CPU-seconds)."""
    return built_once(tmp_path_factory, "image", _build_image_venv) / "runtime"


def _build_image_venv(tmp: Path) -> None:
    build, runtime, dist = tmp / "build", tmp / "runtime", tmp / "dist"
    for venv in (build, runtime):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    _pip(build / "bin" / "python", "install", "--require-hashes", "--no-deps", "-r", str(BUILD_LOCK), cwd=tmp)
    _pip(
        build / "bin" / "python",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--wheel-dir",
        str(dist),
        str(REPO),
        cwd=tmp,
    )
    wheels = list(dist.glob("bucketq-*.whl"))
    assert len(wheels) == 1, f"expected one bucketq wheel, got {wheels}"
    _pip(
        runtime / "bin" / "python", "install", "--require-hashes", "--no-deps", "-r", str(IMAGE_LOCK), cwd=tmp
    )
    _pip(
        runtime / "bin" / "python",
        "install",
        "--no-index",
        "--find-links",
        str(dist),
        f"bucketq[{','.join(IMAGE_EXTRAS)}]",
        cwd=tmp,
    )
    _pip(runtime / "bin" / "python", "check", cwd=tmp)


def _run(venv: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]],
        cwd=venv,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "command", [["--help"], ["sidecar", "--help"], ["operator", "--help"], ["crds", "--help"]]
)
def test_entrypoint_commands_work_from_the_image_virtualenv(image_venv: Path, command: list[str]) -> None:
    result = _run(image_venv, "bucketq", *command)
    assert result.returncode == 0, f"bucketq {' '.join(command)} exited {result.returncode}:\n{result.stderr}"
    assert "Usage: bucketq" in result.stdout


@pytest.mark.slow
def test_image_virtualenv_imports_every_module_it_ships(image_venv: Path) -> None:
    """Every module but Spark's (not in the image) imports: the lock carries kopf, cryptography..."""
    code = (
        "import importlib, pkgutil, bucketq\n"
        "bad = []\n"
        "for m in pkgutil.walk_packages(bucketq.__path__, 'bucketq.'):\n"
        "    if m.name.endswith('__main__') or m.name.startswith('bucketq.spark'):\n"
        "        continue\n"
        "    try:\n"
        "        importlib.import_module(m.name)\n"
        "    except Exception as exc:\n"
        "        bad.append(f'{m.name}: {exc!r}')\n"
        "print('\\n'.join(bad))\n"
        "raise SystemExit(1 if bad else 0)\n"
    )
    result = _run(image_venv, "python", "-c", code)
    assert result.returncode == 0, (
        "modules that do not import with the image's dependencies (add them to pyproject, then make lock):\n"
        + result.stdout
        + result.stderr[-2000:]
    )


@pytest.mark.slow
def test_image_virtualenv_generates_the_charts_crds(image_venv: Path) -> None:
    result = _run(image_venv, "bucketq", "crds", "--check", "--out", str(REPO / "helm" / "bucketq" / "crds"))
    assert result.returncode == 0, f"the wheel's CRDs differ from the chart's (make crds):\n{result.stderr}"
