"""Fixtures for the ``multinode`` tests: a real cluster of namespace nodes on this machine (``cluster.py``).

``make test-multinode`` runs this folder (serially: each test keeps both cores busy). ``make test`` does
not: the tests marked ``multinode`` are deselected unless this folder (or a file in it) is named on the
command line, or the ``-m`` expression names ``multinode``.

The tests skip, with the reason, where no cluster can be made (not root, no ``ip``/``unshare``/
``nsenter``/``setpriv``, namespaces refused); under CI (``CI`` set) that is a failure instead, as for
``tests/slurm``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import uninterrupted

from .cluster import Cluster, leftovers, remove, unavailable
from .launch import SINGLE

HERE = Path(__file__).resolve().parent
MARK = "multinode"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARK}: on a cluster of Linux namespace nodes (root; `make test-multinode`)"
    )


def _asked_for(config: pytest.Config) -> bool:
    """Whether this run names the multinode tests: their folder or a file in it, or the marker."""
    if MARK in (config.option.markexpr or ""):
        return True
    base = config.invocation_params.dir
    for arg in config.args:
        path = (base / arg.split("::", 1)[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _asked_for(config):
        return
    deselected = [item for item in items if item.get_closest_marker(MARK)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not item.get_closest_marker(MARK)]


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def cluster_support(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Skip (fail under CI) where no cluster can be made; at the end, no namespace or link of this run
    may be left."""
    reason = unavailable(str(tmp_path_factory.mktemp("cluster-probe")))
    if reason:
        message = f"no namespace cluster on this machine: {reason}"
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)
    yield
    left = leftovers(os.getpid())
    remove(os.getpid())
    assert not left, f"namespace cluster leftovers: {left}"


@pytest.fixture
def cluster(cluster_support: None, tmp_path: Path) -> Iterator[Cluster]:
    """Two nodes (``node0``, ``node1``) on a bridge; ``tmp_path`` is their shared filesystem. Removed when
    the test ends, however it ends."""
    with Cluster(2, workdir=tmp_path) as made:
        yield made


@pytest.fixture(scope="session")
def reference(cluster_support: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The final weights of the cluster jobs' training run as one uninterrupted command on this machine
    (two ranks, Lightning's own DDP launch), built once per test run."""
    return uninterrupted(tmp_path_factory, "cluster-reference", *SINGLE)
