"""Shared fixtures: a real etcd on free loopback ports, and a connected llmgw.store.Store."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `tests.fixtures` importable

from llmgw.dev.etcd import etcd_cluster
from llmgw.store import Store


@pytest.fixture
def etcd(tmp_path_factory):
    cluster = etcd_cluster(tmp_path_factory.mktemp("etcd"), size=1).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def etcd3(tmp_path_factory):
    """A three-member etcd cluster."""
    cluster = etcd_cluster(tmp_path_factory.mktemp("etcd3"), size=3).start()
    yield cluster
    cluster.stop()


@pytest.fixture
async def store(etcd):
    s = Store(etcd.endpoint)
    await s.connect()
    yield s
    await s.close()
