import os
import tempfile

import pytest

# Builds (the torch bindings, variants) go to a per-user cache; a test run gets one of its own,
# shared by all its tests and the processes they start, so that the bindings build once a run.
_made_cache = None  # the run's own cache, removed when it ends (a worker of pytest-xdist has its controller's)
if "TUNER_CACHE" not in os.environ:
    if not os.environ.get("TUNER_TEST_CACHE"):
        _made_cache = tempfile.mkdtemp(prefix="tuner-cache-")
    os.environ["TUNER_CACHE"] = os.environ.get("TUNER_TEST_CACHE") or _made_cache


# The families' torch bindings, in the order the test files (SLOW_FILES below first) load them. Each
# takes a minute of one core to build (it includes torch's headers): one background process, started
# by the run's first process (pytest-xdist's controller under `-n`), builds them while the tests run,
# and a test that needs one finds it built or waits for its build (`tuner.build.binding`'s lock),
# never builds it twice. The workers inherit this process's TUNER_CACHE, so that they share what it
# builds.
PREBUILT = ("embedding_bag", "giou", "cross_entropy", "rms_norm")
_prebuild = None


def pytest_sessionstart(session):
    global _prebuild
    if os.environ.get("TUNER_TEST_PREBUILD", "1") == "0" or hasattr(session.config, "workerinput"):
        return
    import subprocess
    import sys

    code = "import sys\nfrom tuner.build import binding\nfor f in sys.argv[1:]:\n    binding.library(f)\n"
    os.makedirs(os.environ["TUNER_CACHE"], exist_ok=True)
    log = open(os.path.join(os.environ["TUNER_CACHE"], "prebuild.log"), "ab")
    _prebuild = subprocess.Popen([sys.executable, "-c", code, *PREBUILT], stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    log.close()


def pytest_sessionfinish(session, exitstatus):
    """A build still under way when the tests end (a run of a few tests) ends with them, and the
    run's own cache with it (bindings and variants: tens of MB a run)."""
    import shutil
    import signal

    if _prebuild is not None and _prebuild.poll() is None:
        os.killpg(_prebuild.pid, signal.SIGTERM)
        _prebuild.wait()
    if _made_cache is not None and not hasattr(session.config, "workerinput"):
        shutil.rmtree(_made_cache, ignore_errors=True)


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


# The files that take longest on the 2-core CI machine (their waits included: PostgreSQL searchers,
# torch bindings built beside them), in the order pytest-xdist hands them out, before the others
# (most tests first): a long file left for the end would keep one process busy while the other idles.
# test_distributed's searchers time heartbeats, so they start after the heaviest compiles.
SLOW_FILES = ("test_declared.py", "test_build.py", "test_distributed.py", "test_embedding_bag.py", "test_deploy.py",
              "test_family_plugin.py", "test_docs.py", "test_search.py", "test_rms_norm.py", "test_op_cpu.py",
              "test_binding_build.py", "test_cli_errors.py", "test_cli_fuzz.py", "test_quality.py")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist's own order (by test count) otherwise
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist's `--dist loadgroup` (the README's command): a file's tests stay in one
    # worker (its module fixtures made once), and on a machine with a GPU every GPU test goes to one
    # worker, one at a time (they time kernels and share the GPU's memory).
    cuda = _has_cuda()
    counts: dict[str, int] = {}
    for item in items:
        counts[item.path.name] = counts.get(item.path.name, 0) + 1
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -counts[item.path.name], item.path.name))
    for item in items:
        item.add_marker(pytest.mark.xdist_group("gpu" if cuda and "gpu" in item.keywords else item.nodeid.split("::")[0]))
    if cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on a machine with one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tuner_home(tmp_path, monkeypatch):
    """A private TUNER_HOME, so tests never touch the user's variants/ and studies/."""
    monkeypatch.setenv("TUNER_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A private build cache, for tests that count what gets built."""
    monkeypatch.setenv("TUNER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def shared_home(tmp_path_factory):
    """One TUNER_HOME for a whole run, so compiled variants are reused across tests."""
    path = os.environ.get("TUNER_TEST_HOME") or str(tmp_path_factory.mktemp("tuner-home"))
    os.environ["TUNER_HOME"] = path
    return path


@pytest.fixture
def postgres_url():
    """The URL of a PostgreSQL server started for the test (skips where none can run)."""
    import pgserver

    server = pgserver.Server()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def rms_norm_op(tmp_path_factory, shared_home):
    """tuner.load of an RMSNorm export of one variant (bfloat16, the default problem) built for
    an H100, loaded on this machine: the op's C++ and CPU paths, no GPU needed."""
    import tuner
    from tuner.deploy import export
    from tuner.families import rms_norm

    space = rms_norm.space()
    winners = [{"variant": space.variant(threads_per_row=256, block_size=256, vec=8, unroll=2, rstd="saved",
                                         grad_weight="partials", bwd_blocks=2, walk="resident"),
                "problem": rms_norm.Problem().__dict__}]
    return tuner.load(export.write(tmp_path_factory.mktemp("rms"), winners,
                                   {"gpu_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90"}))
