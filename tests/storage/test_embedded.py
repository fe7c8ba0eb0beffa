"""The embedded Valkey: a real server whose data survives a restart on the same directory."""

import os
from pathlib import Path

import pytest
import redis

from busd.storage.redis.embedded import EmbeddedStoreError, EmbeddedValkey, jemalloc_path


def test_data_survives_a_restart_on_the_same_directory(tmp_path):
    store = EmbeddedValkey(tmp_path / "data")
    store.start()
    try:
        client = redis.Redis.from_url(store.url)
        client.set("busd:test:key", "kept")
        client.rpush("busd:test:list", "a", "b")
        client.close()
    finally:
        store.stop()
    assert not store.running
    assert (tmp_path / "data" / "appendonlydir").is_dir()

    store.start()
    try:
        client = redis.Redis.from_url(store.url)
        assert client.get("busd:test:key") == b"kept"
        assert client.lrange("busd:test:list", 0, -1) == [b"a", b"b"]
        client.close()
    finally:
        store.stop()


def test_server_is_durable_and_never_evicts(tmp_path):
    with EmbeddedValkey(tmp_path) as store:
        assert store.url.startswith("redis://127.0.0.1:")
        client = redis.Redis.from_url(store.url, decode_responses=True)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("bind")["bind"].split()[0] == "127.0.0.1"
        client.close()


def test_a_second_server_on_a_directory_in_use_is_refused(tmp_path):
    with EmbeddedValkey(tmp_path):
        second = EmbeddedValkey(tmp_path)
        with pytest.raises(EmbeddedStoreError, match="in use"):
            second.start()
        assert not second.running


def test_two_servers_on_two_directories_get_their_own_ports(tmp_path):
    with EmbeddedValkey(tmp_path / "a") as a, EmbeddedValkey(tmp_path / "b") as b:
        assert a.url != b.url


def test_url_before_start_and_double_stop(tmp_path):
    store = EmbeddedValkey(tmp_path)
    with pytest.raises(EmbeddedStoreError):
        _ = store.url
    store.stop()  # nothing to stop: no error


def test_server_runs_with_jemalloc_when_installed(tmp_path):
    library = jemalloc_path()
    if library is None:
        pytest.skip("libjemalloc2 is not installed: the server runs with its own allocator")
    preload_before = os.environ.get("LD_PRELOAD")
    with EmbeddedValkey(tmp_path) as store:
        client = redis.Redis.from_url(store.url)
        pid = client.info("server")["process_id"]
        client.close()
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert Path(library).name in maps
    # busd's own environment is as it was (only the server got the library)
    assert os.environ.get("LD_PRELOAD") == preload_before


def test_a_data_directory_keeps_the_shard_count_it_was_made_with(tmp_path):
    """One Valkey's data is not hidden behind local shards started on it, nor the reverse."""
    from busd.storage.redis.embedded import EmbeddedCluster, embedded_store

    single = tmp_path / "single"
    with EmbeddedValkey(single) as server:
        redis.Redis.from_url(server.url).set("k", "v")
    with pytest.raises(EmbeddedStoreError, match="one Valkey; start with --store-shards 1"):
        EmbeddedCluster(single, 2).start()

    sharded = tmp_path / "sharded"
    cluster = EmbeddedCluster(sharded, 2)
    with cluster:
        ports = [node.port for node in cluster.nodes]
        assert cluster.url.startswith("redis+cluster://127.0.0.1:")
    assert (sharded / "store-shards").read_text().strip() == "2"
    with pytest.raises(EmbeddedStoreError, match="a Cluster of 2 shards"):
        embedded_store(sharded, 1)
    with pytest.raises(EmbeddedStoreError, match="--store-shards 2"):
        EmbeddedCluster(sharded, 3).start()
    with EmbeddedCluster(sharded, 2) as again:  # back on the ports it had
        assert [node.port for node in again.nodes] == ports


@pytest.mark.parametrize("which", ["port", "bus port"])
def test_a_node_whose_port_is_taken_after_its_probe_starts_again_on_fresh_ports(
    tmp_path, monkeypatch, which
):
    """Another process can take a port between busd's look at it and the server's bind (a
    restart after a crash, with the machine's other processes binding and connecting): the
    node starts on fresh ports and the cluster comes back whole, its data kept."""
    import socket

    from busd.storage.redis import embedded

    with embedded.EmbeddedCluster(tmp_path, 2) as first:
        had = (first.nodes[0].port, first._buses[0])
        client = redis.RedisCluster(host="127.0.0.1", port=first.nodes[1].port)
        keys = [f"k{i}" for i in range(20)]  # over both nodes' slots
        for key in keys:
            client.set(key, key)
        client.close()
    taken = had[0] if which == "port" else had[1]
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past its TIME_WAITs
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        monkeypatch.setattr(embedded, "_port_free", lambda port: True)  # free when looked at
        with embedded.EmbeddedCluster(tmp_path, 2) as again:
            assert taken not in (again.nodes[0].port, again._buses[0])
            client = redis.RedisCluster(host="127.0.0.1", port=again.nodes[1].port)
            assert [client.get(key) for key in keys] == [key.encode() for key in keys]
            client.close()
