"""Secrets and exposure: an API key used by a Dagster probe run is nowhere in what the run leaves.

A real `dagster asset materialize` process probes a pool of `openai` seats on the fault server
(which demands the key as a bearer header, and injects 429/500/400 so error paths are recorded
too). Then the key is searched for in: every row of every table and view of the warehouse and
the raw DuckDB file; every event of every run in the Dagster instance (serialized) and every raw
file under the instance directory (event-log and run SQLite files, compute logs); every asset's
latest materialization metadata; the CLI's own output. The server's counters prove the key was
really sent, so the test cannot pass by never using it.

Also: servers the project starts bind to 127.0.0.1 unless configured otherwise.

The Dagster run takes about 100 s on two shared cores (two CLI runs, each step a fresh process),
so the tests that use it are `slow` (RUN_SLOW=1); the binding checks always run.
"""

from __future__ import annotations

import re
import socket
import uuid
from pathlib import Path

import dagster as dg
import pytest
from dagster._serdes import serialize_value

from benchmarks.soak import synthetic_questions, write_pool_file
from tests.fakes import FaultRates, FaultServer
from conductor_pipeline.paths import PROJECT_ROOT
from conductor_pipeline.warehouse import Warehouse
from tests.reliability.dagster_cli import dagster_env, materialize

KEY_ENV = "CORYPHAEUS_SECRET_TEST_KEY"
SEATS = ("w0", "w1")
N_QUESTIONS = 15
SAMPLES = 2
LOOPBACK_HEX = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it (little-endian)


def find_key(blob: str | bytes, key: str) -> bool:
    needle = key.encode() if isinstance(blob, bytes) else key
    return needle in blob


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One Dagster probe run (then pass rates and ceilings) with a distinctive key; what it left behind."""
    tmp = tmp_path_factory.mktemp("secrets")
    key = f"sk-coryphaeus-DO-NOT-LEAK-{uuid.uuid4().hex}"
    warehouse_path = tmp / "warehouse.duckdb"
    Warehouse(warehouse_path).insert("questions", synthetic_questions(N_QUESTIONS, prefix="secret"))
    faults = FaultRates(rate_limit=0.1, server_error=0.1, bad_request=0.05)
    with FaultServer(faults=faults, retry_after_s=0.01, expected_api_key=key, seed=3) as server:
        pool = write_pool_file(tmp / "keyed-pool.yaml", server.base_url, name="keyed-pool", api_key_env=KEY_ENV,
                               seats=SEATS, concurrency=4, retry={"max_attempts": 3, "base_delay_s": 0.01,
                                                                  "max_delay_s": 0.05})
        home = tmp / "dagster_home"
        env = dagster_env(home, warehouse_path, pool, **{KEY_ENV: key})
        probe_config = {"ops": {"probe_calls": {"config": {"samples": SAMPLES, "corpora": ["gsm8k"]}}}}
        outputs = [
            materialize("probe_calls", env, partition_range=f"{SEATS[0]}...{SEATS[-1]}", run_config=probe_config,
                        log_path=tmp / "probe.log"),
            materialize("pass_rates,oracle_ceilings", env, log_path=tmp / "analysis.log"),
        ]
        stats = server.stats()
    return {"key": key, "warehouse": warehouse_path, "home": home, "outputs": outputs, "stats": stats,
            "pool_file": pool}


@pytest.mark.slow
def test_the_key_was_really_sent_as_a_bearer_header(probed: dict) -> None:
    stats = probed["stats"]
    assert stats.total_requests >= len(SEATS) * N_QUESTIONS * SAMPLES
    assert stats.auth_ok == stats.total_requests and stats.unauthorized == 0
    assert stats.served["rate_limit"] + stats.served["server_error"] + stats.served["bad_request"] > 0
    assert not find_key(probed["pool_file"].read_text(), probed["key"])  # the pool file names only the variable


@pytest.mark.slow
def test_the_key_is_not_in_the_warehouse(probed: dict) -> None:
    key = probed["key"]
    store = Warehouse(probed["warehouse"])
    with store.connect() as con:
        relations = [row[0] for row in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()]
        assert {"calls", "questions", "workflows", "outcomes"} <= set(relations)
        searched_rows = 0
        for name in relations:
            frame = con.table(name).pl()  # the relation API: no SQL built from a name
            searched_rows += frame.height
            assert not find_key(repr(frame.rows()), key), name
        errors = con.execute("SELECT count(*) FROM calls WHERE error IS NOT NULL").fetchone()[0]
    assert searched_rows >= len(SEATS) * N_QUESTIONS * SAMPLES
    assert errors > 0  # error texts (429/500/400 bodies) were recorded and searched
    assert not find_key(probed["warehouse"].read_bytes(), key)


@pytest.mark.slow
def test_the_key_is_not_in_the_dagster_instance_or_any_metadata(probed: dict) -> None:
    key = probed["key"]
    with dg.DagsterInstance.from_config(str(probed["home"])) as instance:
        runs = instance.get_runs()
        assert len(runs) == 2 and all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs)
        events = 0
        for run in runs:
            assert not find_key(serialize_value(run), key)
            for record in instance.all_logs(run.run_id):
                events += 1
                assert not find_key(serialize_value(record), key)
        assert events > 20
        asset_keys = instance.all_asset_keys()
        assert {dg.AssetKey("probe_calls"), dg.AssetKey("pass_rates"), dg.AssetKey("oracle_ceilings")} <= set(asset_keys)
        for asset_key in asset_keys:
            event = instance.get_latest_materialization_event(asset_key)
            assert event is not None and event.asset_materialization is not None
            metadata = {name: value.value for name, value in event.asset_materialization.metadata.items()}
            assert metadata and not find_key(repr(metadata), key), asset_key


@pytest.mark.slow
def test_the_key_is_not_in_any_file_under_the_instance_nor_in_the_cli_output(probed: dict) -> None:
    key = probed["key"]
    files = [path for path in probed["home"].rglob("*") if path.is_file()]
    compute_logs = [path for path in files if path.suffix in (".err", ".out", ".complete") or "compute_logs" in str(path)]
    assert compute_logs, f"no compute logs found under {probed['home']}: {[str(p) for p in files][:20]}"
    for path in files:
        assert not find_key(path.read_bytes(), key), path
    for output in probed["outputs"]:
        assert "RUN_SUCCESS" in output or "Materialized" in output or "success" in output.lower()
        assert not find_key(output, key)


# --- servers bind to 127.0.0.1 -------------------------------------------------------------------


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) of sockets listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net/tcp to see bound addresses")
def test_fault_server_binds_loopback_by_default() -> None:
    with FaultServer() as server:
        assert server.host == "127.0.0.1"
        assert listening_addresses(server.port) == {LOOPBACK_HEX}
        # And from outside loopback it is not reachable (when this machine has another address).
        other = socket.gethostbyname(socket.gethostname())
        if not other.startswith("127."):
            with pytest.raises(OSError), socket.create_connection((other, server.port), timeout=2):
                pass


def test_vllm_launcher_binds_loopback_by_default() -> None:
    from conductor_pipeline.pools.backends.vllm_server import VllmServer  # noqa: PLC0415
    from conductor_pipeline.pools.config import WorkerSeat  # noqa: PLC0415
    from resources.vllm import VllmLauncherResource  # noqa: PLC0415

    seat = WorkerSeat(name="q4", backend="vllm", model="Qwen/Qwen2.5-3B-Instruct", description="local seat")
    argv = VllmServer(seat).argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert VllmLauncherResource.model_fields["host"].default == "127.0.0.1"


def test_no_project_source_binds_all_interfaces() -> None:
    """`0.0.0.0` (or `::`) in a server command line would expose a worker or the UI to the network."""
    wildcard = re.compile(r"""(["'\s=])(0\.0\.0\.0|::)(["'\s]|$)""")
    sources = [*PROJECT_ROOT.glob("conductor_pipeline/**/*.py"), *PROJECT_ROOT.glob("resources/**/*.py"),
               *PROJECT_ROOT.glob("assets/**/*.py"), *PROJECT_ROOT.glob("scripts/**/*"),
               *PROJECT_ROOT.glob("data/**/*.yaml"), PROJECT_ROOT / "Makefile", PROJECT_ROOT / "workspace.yaml"]
    offenders = [str(p) for p in sources if p.is_file() and wildcard.search(p.read_text(errors="replace"))]
    assert not offenders
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    for line in makefile.splitlines():
        if "dagster dev" in line or "dagster-webserver" in line:
            assert "-h 127.0.0.1" in line or "--host 127.0.0.1" in line, line
