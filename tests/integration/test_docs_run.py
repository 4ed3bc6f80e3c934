"""The shell blocks of README.md and docs/*.md, run as a user runs them.

Every fenced ``bash``, ``sh``, ``shell`` or ``console`` block is either run here or carries, on
the line before it, ``<!-- not run: REASON -->`` (a Kubernetes cluster, a Ray cluster, another
host, an install of the package itself, a placeholder a user fills in). A block whose first lines
install and start (``python3 -m venv ... && clipper start``) may say what the test runs in its
place instead: ``<!-- run instead: clipper start --demo -->``. The cheap test below (always run)
fails on any other block: one that is neither run nor says why.

The heavy test (``-m docs``, as ``.ci/run`` does, or ``CLIPPER_DOCS_TEST=1``: about two minutes,
a frontend and model replicas per document) runs each document's blocks in order, in a scratch
home directory (so ``~/.clipper``, the state directory the docs name, is a fresh one), against a
real frontend on free ports: the documented ports (1337, 1338, 7000, 8001) are given to the
frontend and the client commands through their variables (``CLIPPER_QUERY_PORT``,
``CLIPPER_ADMIN_URL``, ...) and rewritten in the commands' text (``curl http://127.0.0.1:1337``).
A document that assumes an earlier one's state (``logreg`` with two versions) gets it from the
commands in ``SETUP``, through the same CLI. Each command must exit 0; a ``# {...}`` line after a
command is the JSON it must print (``query_id`` aside). ``clipper start`` runs in the background
until the document is done.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.docs, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
SHELLS = ("bash", "sh", "shell", "console")
PORTS = {"QUERY": 1337, "ADMIN": 1338, "RPC": 7000, "GRPC": 8001}
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
NOT_RUN = re.compile(r"^\s*<!-- not run: (.+?) -->\s*$")
INSTEAD = re.compile(r"^\s*<!-- run instead: (.+?) -->\s*$")
COMMAND_LIMIT_S = 120.0
READY_LIMIT_S = 120.0
READY = b"clipper-serve ready: query API at "

# What a document assumes is already served (from the user guide's steps 2-4), made through the
# same CLI before its blocks run; ``start`` first when the document starts no frontend itself.
GUIDE = [
    "clipper app register digits --input-type doubles --default-output -1 --slo-micros 20000",
    "clipper model deploy logreg.joblib --name logreg --version 1 --input-type doubles",
    "clipper model deploy logreg-v2.joblib --name logreg --version 2 --input-type doubles",
    "clipper link digits logreg",
]
SETUP: dict[str, list[str]] = {
    "docs/autoscaling.md": ["clipper start", *GUIDE],
    "docs/tenants.md": ["clipper start", *GUIDE],
    "docs/rollouts.md": [
        "clipper start",
        "clipper app register digits --input-type doubles --default-output -1 --slo-micros 20000",
        "clipper model deploy logreg.joblib --name digits --version 1 --input-type doubles",
        "clipper model deploy logreg-v2.joblib --name digits --version 3 --input-type doubles",
        "clipper model set-version digits 1",
        "clipper link digits digits",
    ],
    "docs/cli.md": ["clipper start"],
    "docs/pipelines.md": [
        "clipper start",
        "clipper model deploy logreg.joblib --name logreg --version 1 --input-type doubles",
    ],
}
# The description file docs/pipelines.md's commands read (its own example elides the stages).
CHAIN = {
    "input_type": "doubles",
    "latency_slo_micros": 50000,
    "default_output": "null",
    "stages": [{"name": "score", "model": "logreg"}],
    "output": "$score",
}


@dataclass(frozen=True)
class Block:
    """One fenced shell block: where it is, its text, and what the line before it says."""

    doc: str
    line: int
    lang: str
    text: str
    not_run: str | None
    instead: str | None

    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass(frozen=True)
class Command:
    """A command line of a block, and the JSON it is documented to print (if any)."""

    text: str
    prints: object | None


def blocks(doc: str) -> list[Block]:
    """Every fenced shell block of ``doc``, in order."""
    lines = (ROOT / doc).read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None or not m.group(2):
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        if m.group(2) in SHELLS:
            not_run, instead = NOT_RUN.match(before), INSTEAD.match(before)
            found.append(
                Block(
                    doc, i + 1, m.group(2), "\n".join(lines[i + 1 : end]),
                    not_run.group(1) if not_run else None, instead.group(1) if instead else None,
                )
            )  # fmt: skip
        i = end + 1
    return found


def commands(block: Block) -> list[Command]:
    """The block's commands: a console block's ``$`` lines, every line of the others (``\\``
    continuations joined, comment lines left out); ``# {...}`` after a command is its output."""
    if block.instead is not None:
        return [Command(block.instead, None)]
    found: list[Command] = []
    pending = ""
    for raw in block.text.splitlines():
        line = raw.strip()
        if block.lang == "console":
            if line.startswith("$ "):
                found.append(Command(line[2:], None))
            continue
        if pending:
            line, pending = f"{pending} {line}", ""
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        if line.startswith("# {") and found:
            found[-1] = Command(found[-1].text, orjson.loads(line[2:]))
        elif line and not line.startswith("#"):
            found.append(Command(line, None))
    return found


def unrunnable(command: str) -> str | None:
    """Why a command cannot run as written, or None."""
    if re.search(r"\.\.\.|<[a-z][^>]*>", re.sub(r"#.*", "", command)):
        return "a placeholder (... or <name>) a user fills in"
    if re.search(r"(^|[\s;&|(])(kubectl|helm|ray|apt-get|perf_analyzer)\s", command):
        return "a tool or cluster this machine does not have"
    if re.search(r"pip install|python3? -m venv|source ", command):
        return "installs the package (run by -m readme)"
    if command.rstrip().endswith(" -f") or re.search(r"\bcurl -N\b", command):
        return "runs until interrupted"
    return None


def every_block() -> list[Block]:
    return [b for doc in DOCUMENTS for b in blocks(doc)]


def test_every_shell_block_is_run_or_says_why_not() -> None:
    """Cheap, and always run: no block is left out silently, and a marker has a reason."""
    found = every_block()
    assert len(found) > 20, [b.where() for b in found]  # the extraction still finds them
    unmarked = [
        f"{b.where()}: {c.text!r}: {why}"
        for b in found
        if b.not_run is None
        for c in commands(b)
        if (why := unrunnable(c.text)) is not None
    ]
    assert not unmarked, "blocks that cannot run need <!-- not run: REASON -->:\n" + "\n".join(
        unmarked
    )
    marked = [b for b in found if b.not_run is not None]
    assert all(len(b.not_run or "") > 10 for b in marked), [b.where() for b in marked]
    # A marker stands right before a shell block: none is stray (before a python block, say).
    for doc in DOCUMENTS:
        text = (ROOT / doc).read_text()
        markers = len(re.findall(r"^\s*<!-- (not run|run instead): ", text, re.M))
        assert markers == sum(1 for b in blocks(doc) if b.not_run or b.instead), doc


def test_the_extraction_reads_a_console_block_and_expected_output() -> None:
    console = Block(
        "x.md", 1, "console", "$ clipper stop\nstopped ...\n$ clipper stop\n", None, None
    )
    assert [c.text for c in commands(console)] == ["clipper stop", "clipper stop"]
    shell = Block("x.md", 1, "bash", 'a --x \\\n  --y\n# {"a": 1}\n# note\nb # why', None, None)
    assert commands(shell) == [Command("a --x --y", {"a": 1}), Command("b # why", None)]
    assert unrunnable("clipper predict digits '[0, 5, ...]'") is not None
    assert unrunnable("clipper model split digits 1=95 2=5  # 5% ...") is None


def runnable_documents() -> list[str]:
    return [d for d in DOCUMENTS if any(b.not_run is None for b in blocks(d))]


def _asked(config: pytest.Config) -> bool:
    markexpr = str(config.getoption("markexpr", "") or "")
    return ("docs" in markexpr and "not docs" not in markexpr) or (
        os.environ.get("CLIPPER_DOCS_TEST") == "1"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model files the docs deploy: the user guide's own training block writes
    logreg.joblib; logreg-v2.joblib and v2.pkl are a second model of the same kind."""
    where = tmp_path_factory.mktemp("models")
    guide = (ROOT / "docs/user-guide.md").read_text()
    train = next(b for b in re.findall(r"```python\n(.*?)```", guide, re.S) if "joblib.dump" in b)
    v2 = train.replace("max_iter=2000", "max_iter=2000, C=0.05").replace(
        '"logreg.joblib"', '"logreg-v2.joblib"'
    )
    for code in (train, v2):
        subprocess.run([sys.executable, "-c", code], cwd=where, check=True, timeout=300)
    shutil.copy(where / "logreg-v2.joblib", where / "v2.pkl")
    return where


def _files_for(doc: str, work: Path, env: dict[str, str]) -> None:
    """The files a document's commands name that the document itself does not make."""
    if doc == "docs/pipelines.md":
        (work / "chain.json").write_bytes(orjson.dumps(CHAIN))
    if doc == "docs/cli.md":
        # ``clipper apply -f clipper.yaml``: the file is the document's YAML block, and the
        # models it names (a joblib file, an artifact directory, a pickle) are the guide's.
        text = (ROOT / doc).read_text()
        (work / "clipper.yaml").write_text(re.findall(r"```yaml\n(.*?)```", text, re.S)[0])
        (work / "models").mkdir()
        shutil.copy(work / "logreg.joblib", work / "models/logreg-1.joblib")
        shutil.copy(work / "logreg-v2.joblib", work / "models/forest.pkl")
        code = (
            "import joblib, sys; from clipper.deployers import package; "
            "package(joblib.load(sys.argv[1]), sys.argv[2])"
        )
        subprocess.run(
            [sys.executable, "-c", code, "logreg-v2.joblib", "models/logreg-2"],
            cwd=work, env=env, check=True, timeout=120,
        )  # fmt: skip


@contextlib.contextmanager
def _background(command: str, cwd: Path, env: dict[str, str], log: Path) -> Iterator[None]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", command], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + READY_LIMIT_S
        while READY not in log.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{command!r} was not ready:\n{log.read_bytes()[-3000:].decode()}")
            time.sleep(0.2)
        yield
    finally:
        # The whole session: the frontend and its replicas (a drain first, as Ctrl-C does).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _environment(home: Path, tools: Path) -> tuple[dict[str, str], dict[int, int]]:
    """A user's shell in a scratch home, with the frontend and the client on free ports."""
    ports = {name: _free_port() for name in PORTS}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLIPPER_", "PYTEST_"))}
    if env.get("PYTHONPATH"):  # the commands run elsewhere: this checkout's code, wherever
        paths = env["PYTHONPATH"].split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in paths if p)
    env.update(
        HOME=str(home),
        PATH=f"{tools}{os.pathsep}{env.get('PATH', '')}",
        CLIPPER_ADMIN_URL=f"http://127.0.0.1:{ports['ADMIN']}",
        CLIPPER_URL=f"http://127.0.0.1:{ports['QUERY']}",
        **{f"CLIPPER_{name}_PORT": str(port) for name, port in ports.items()},
    )
    return env, {PORTS[name]: port for name, port in ports.items()}


def _tools(where: Path) -> Path:
    """``clipper`` and ``python`` on the PATH, as the docs assume: this test's interpreter (and,
    through PYTHONPATH, this checkout's code)."""
    where.mkdir()
    # Scripts, not links: a link to a venv's python starts without the venv's packages.
    for name, run in (("clipper", "-m clipper "), ("python", ""), ("python3", "")):
        (where / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" {run}"$@"\n')
        (where / name).chmod(0o755)
    return where


def _rewrite(command: str, ports: dict[int, int]) -> str:
    return re.sub(r"\b(1337|1338|7000|8001)\b", lambda m: str(ports[int(m.group(1))]), command)


@pytest.mark.parametrize("doc", runnable_documents())
def test_the_documents_shell_blocks_run(
    request: pytest.FixtureRequest, tmp_path: Path, doc: str
) -> None:
    if not _asked(request.config):
        pytest.skip("the docs' shell blocks against real frontends: run with -m docs")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    shutil.copytree(request.getfixturevalue("models"), work)
    env, ports = _environment(home, _tools(tmp_path / "bin"))
    _files_for(doc, work, env)
    todo = [Command(c, None) for c in SETUP.get(doc, [])]
    todo += [c for b in blocks(doc) if b.not_run is None for c in commands(b)]
    ran: list[str] = []
    with contextlib.ExitStack() as frontends:
        for n, command in enumerate(todo):
            text = _rewrite(command.text, ports)
            if re.match(r"clipper start( |$)", text):
                log = tmp_path / f"frontend-{n}.log"
                frontends.enter_context(_background(text, work, env, log))
                ran.append(text)
                continue
            done = subprocess.run(
                ["bash", "-c", text], cwd=work, env=env, capture_output=True,
                timeout=COMMAND_LIMIT_S, check=False,
            )  # fmt: skip
            out = done.stdout.decode(errors="replace")
            said = f"{doc}: {text!r} exited {done.returncode}:\n{out}{done.stderr.decode()}"
            assert done.returncode == 0, said
            if command.prints is not None:
                got = orjson.loads(out.strip().splitlines()[-1])
                assert isinstance(got, dict) and isinstance(command.prints, dict), said
                assert {**got, "query_id": 0} == {**command.prints, "query_id": 0}, said
            ran.append(text)
    assert ran, doc
    print(f"{doc}: ran {len(ran)} commands", file=sys.stderr)
