"""The compiled build (setup.py's HOT_PATH, scripts/compile): every hot-path module loads
compiled, everything else imports beside it, and the tests of what the compiled modules
do pass against it.

The suite itself runs on pure Python: some tests subclass or patch classes that a
compiled build fixes. Here a second pytest process (two xdist workers) runs the quick
tests of protocols/, gateway/ (the core, the transports, the store, the front-ends, the
cluster, the bridge, rules, auth, admin...), the interop suite with real clients, the
conformance and fuzz tests, with the compiled copy first on the path
(``PYTHONSAFEPATH``, ``--import-mode=append``), for the tests' own imports and for the
gatewayd processes they start (``$EDGE_GATEWAY_TEST_SRC``).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.compiled import compiled_tree

REPO = Path(__file__).resolve().parents[1]
# the build takes about a minute, the inner suite about 5 (two workers)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

#: Test files (or single tests) that only pure Python can run, and why.
PURE_ONLY = {
    # fakes that subclass EffectLoop / StreamShell (an interpreted class cannot)
    "tests/gateway/net/test_timer_wheel.py": "subclasses EffectLoop",
    "tests/gateway/net/test_commit_gate.py": "subclasses EffectLoop",
    # a float's identity: compiled code unboxes floats
    "tests/protocols/mqtt/test_rx_time.py": "asserts a float object's identity",
    # expects the version line of the pure build
    "tests/gateway/config/test_config.py::test_versions": "names the build: pure",
}
SUITE = ["tests/protocols", "tests/gateway", "tests/interop", "tests/conformance",
         "tests/fuzz"]


def hot_path() -> list[str]:
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "HOT_PATH":
            paths: list[str] = ast.literal_eval(node.value)
            return paths
    raise AssertionError("setup.py has no HOT_PATH")


def compiled_env(tree: Path) -> dict[str, str]:
    """The compiled copy first on the path, for this process's imports and for the
    gatewayd children the tests start (tests.harness.gatewayd.SRC)."""
    return dict(os.environ, PYTHONPATH=str(tree), PYTHONSAFEPATH="1",
                EDGE_GATEWAY_TEST_SRC=str(tree))


@pytest.fixture(scope="module")
def tree() -> Path:
    return compiled_tree()


def test_every_hot_path_module_loads_compiled(tree: Path) -> None:
    modules = [p.removesuffix(".py").replace("/", ".") for p in hot_path()]
    code = f"import importlib\nfor m in {modules!r}: print(importlib.import_module(m).__file__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=compiled_env(tree), cwd=tree, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    files = r.stdout.split()
    assert len(files) == len(modules) and all(f.endswith(".so") for f in files), files
    assert all(f.startswith(str(tree)) for f in files)


def test_every_other_module_imports_beside_them(tree: Path) -> None:
    """An interpreted subclass of a compiled class fails when its module loads."""
    code = (
        "import importlib, pkgutil\n"
        "for pkg in ('gateway', 'protocols'):\n"
        "    for i in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + '.'):\n"
        "        importlib.import_module(i.name)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=compiled_env(tree), cwd=tree, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_gatewayd_children_of_tests_run_compiled(tree: Path) -> None:
    """The interop, conformance and end-to-end tests start gatewayd processes through
    tests.harness.gatewayd: under compiled_env those run the compiled copy too."""
    code = (
        "import subprocess\n"
        "from tests.harness.gatewayd import gatewayd_command, gatewayd_env\n"
        "print(subprocess.run(gatewayd_command('--version'), env=gatewayd_env(),\n"
        "                     capture_output=True, text=True, check=True).stdout)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(compiled_env(tree), PYTHONPATH=f"{tree}:{REPO}"), cwd=REPO,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "(compiled)" in r.stdout, r.stdout


def test_the_hot_paths_tests_pass_compiled(tree: Path) -> None:
    ignores = [f"--deselect={t}" if "::" in t else f"--ignore={t}" for t in PURE_ONLY]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--import-mode=append", "-q", "-n", "2",
         "-p", "no:cacheprovider", "-m", "not slow", *ignores, *SUITE],
        capture_output=True, text=True, env=compiled_env(tree), cwd=REPO, timeout=2400,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout.splitlines()[-1]


def test_either_build_replays_the_journal_the_other_wrote(tree: Path, tmp_path: Path) -> None:
    """An image upgrade from a pure build to a compiled one (or back) keeps what was
    acknowledged: QoS 1 messages queued for an offline persistent session, gatewayd
    killed (-9) with them in the journal log, then started from the other build."""
    from tests.gateway.admin.gatewayd import Gatewayd
    from tests.gateway.store.test_storage_faults import Publisher, drain_keeper, keeper_session

    gw = Gatewayd(tmp_path / "gw", src=REPO)
    try:
        for writer, reader, build in ((REPO, tree, "compiled"), (tree, REPO, "pure")):
            gw.src = writer
            gw.start()
            keeper_session(gw, 5)
            pub = Publisher(gw, "pub", 5)
            mids = [pub.publish(f"t/{build}/{i}", os.urandom(100)) for i in range(200)]
            pub.wait_answers(mids)
            assert all(pub.answers[m] == 0 for m in mids)
            pub.close()
            assert gw.proc is not None
            gw.proc.kill()
            gw.proc.wait()
            gw.src = reader
            gw.start()
            assert gw.process is not None
            assert f"({build} build)" in gw.process.log_since_start()
            expected = pub.acked_topics()
            got = drain_keeper(gw, 5, expected)
            assert expected <= got, f"{build}: lost {len(expected - got)} acknowledged messages"
            gw.stop()
    finally:
        gw.stop()


def test_scripts_compile_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args, says in [((str(tmp_path),), "is not a source tree"),
                       (("--bogus",), "unknown option --bogus"),
                       (("a", "b"), "only one DIR")]:
        r = subprocess.run([str(REPO / "scripts/compile"), *args], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2, (args, r.stderr)
        assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
