"""Why a URL of ``bench.stopstart`` never ended: the evidence, gathered while the stack
still runs.

For each lost uuid: how often (and when) the origin was asked for its path; every record
that holds it in ``inbound_images`` and in its source's queue (partition, offset, read
without a consumer group, and again with kcat when it is on PATH); the worker group's
committed offset and the log's start and end of each of that queue's partitions; and what
every process logged about it: the lines naming the uuid, the tasks started at its
offset, and the history of its partition (assignments, revocations, commits, drains).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from image_crawler import contract as c
from test.harness.crawl import Outputs
from test.harness.processes import committed_offset

# Events of a worker's log that tell a partition's history.
PARTITION_EVENTS = frozenset({"partitions_assigned", "partitions_revoked"})
WORKER_EVENTS = frozenset(
    {"commit_failed", "draining", "handing_back", "worker_stopped", "urls_lost", "consume_failed"}
)
TIMELINE_LINES = 120
# task_started events this many offsets either side of a lost one go in its timeline.
NEIGHBOURS = 2


@dataclasses.dataclass(frozen=True, slots=True)
class Held:
    """One record holding a uuid."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    value: str


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionState:
    partition: int
    log_start: int
    log_end: int
    committed: int | None


async def read_all(
    bootstrap: str, topic: str, timeout_s: float = 30.0
) -> tuple[list[Any], dict[int, tuple[int, int]]]:
    """Every record of ``topic`` (no consumer group), and each partition's (start, end)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
    )
    await consumer.start()
    try:
        await consumer.topics()
        partitions = sorted(consumer.partitions_for_topic(topic) or ())
        tps = [TopicPartition(topic, p) for p in partitions]
        if not tps:
            return [], {}
        consumer.assign(tps)
        starts = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, starts[tp])
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        idle = False
        while time.monotonic() < deadline:
            positions = [await consumer.position(tp) for tp in tps]
            # tansu on S3 reports stale end offsets: read on until a poll brings nothing.
            if idle and all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                break
            batches = await consumer.getmany(timeout_ms=1000)
            idle = not batches
            for batch in batches.values():
                records.extend(batch)
        bounds = {tp.partition: (starts[tp], ends[tp]) for tp in tps}
        return records, bounds
    finally:
        await consumer.stop()


def holding(records: Iterable[Any], uuid: str) -> list[Held]:
    found = []
    for record in records:
        value = (record.value or b"").decode(errors="replace")
        key = (record.key or b"").decode(errors="replace")
        if uuid in value or key == uuid:
            found.append(
                Held(record.topic, record.partition, record.offset, record.timestamp, value)
            )
    return found


async def partition_states(
    bootstrap: str, topic: str, bounds: Mapping[int, tuple[int, int]]
) -> list[PartitionState]:
    states = []
    for partition, (start, end) in sorted(bounds.items()):
        committed = await committed_offset(bootstrap, c.WORKER_GROUP, topic, partition)
        states.append(PartitionState(partition, start, end, committed))
    return states


def kcat_record(bootstrap: str, topic: str, partition: int, offset: int) -> str:
    """The record as kcat reads it (a second client, to rule out aiokafka), or why not."""
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    if kcat is None:
        return "kcat not on PATH"
    command = [kcat, "-C", "-b", bootstrap, "-t", topic, "-p", str(partition)]
    command += ["-o", str(offset), "-c", "1", "-e", "-f", "%t %p %o key=%k %s\\n"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return "kcat timed out"
    return (done.stdout.strip() or done.stderr.strip())[:500]


def log_events(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            event = {"event": "raw", "line": line}
        if isinstance(event, dict):
            events.append(event)
    return events


def _about(event: dict[str, Any], uuid: str, topic: str, held: Sequence[Held]) -> bool:
    """Whether a log event belongs in the lost uuid's timeline."""
    name = event.get("event")
    name_tp = {f"{h.topic}:{h.partition}" for h in held if h.topic == topic}
    if uuid in json.dumps(event):
        return True
    if name in WORKER_EVENTS:
        return True
    if name in PARTITION_EVENTS:
        return bool(name_tp & set(event.get("topic_partitions", ())))
    if name == "committing":
        return bool(name_tp & set(event.get("offsets", {})))
    if name == "task_started":
        # The lost offset and its neighbours: a gap says the record was never read.
        return any(
            event.get("source") == topic.removeprefix("urls.")
            and event.get("partition") == h.partition
            and abs(int(event.get("offset", -99)) - h.offset) <= NEIGHBOURS
            for h in held
        )
    return False


def never_started(logs: Sequence[Path], topic: str, partition: int, end: int) -> list[int]:
    """Offsets below ``end`` of the partition that no worker's ``task_started`` (a DEBUG
    event) names: records never read, or parked without running."""
    source = topic.removeprefix("urls.")
    started = {
        int(e["offset"])
        for path in logs
        for e in log_events(path)
        if e.get("event") == "task_started"
        and e.get("source") == source
        and e.get("partition") == partition
    }
    return [o for o in range(end) if o not in started]


def committed_past(logs: Sequence[Path], topic: str, partition: int, offset: int) -> str:
    """The first commit (a DEBUG ``committing`` event) that moved past ``offset``."""
    name = f"{topic}:{partition}"
    commits = sorted(
        (str(e.get("time")), path.stem, int(e["offsets"][name]))
        for path in logs
        for e in log_events(path)
        if e.get("event") == "committing" and name in e.get("offsets", {})
    )
    first = next((c for c in commits if c[2] > offset), None)
    return "none logged" if first is None else f"{first[1]} committed {first[2]} at {first[0]}"


def timeline(logs: Sequence[Path], uuid: str, topic: str, held: Sequence[Held]) -> list[str]:
    """What the processes logged about the uuid and its partitions, in time order."""
    lines = []
    for path in logs:
        for event in log_events(path):
            if _about(event, uuid, topic, held):
                shown = {k: v for k, v in event.items() if k not in ("time", "level", "logger")}
                lines.append(f"{event.get('time', '?')} {path.stem}: {json.dumps(shown)[:400]}")
    lines.sort()
    if len(lines) > TIMELINE_LINES:
        # The start and, above all, the end: the stop and the restart.
        lines = [*lines[:20], f"... {len(lines) - TIMELINE_LINES} lines ...", *lines[-100:]]
    return lines


def requests_of(request_log: Sequence[tuple[float, str]], path: str) -> str:
    offset = time.time() - time.monotonic()
    times = [
        time.strftime("%H:%M:%S", time.gmtime(t + offset)) + f".{int((t % 1) * 1000):03d}"
        for t, asked in request_log
        if asked == path
    ]
    return f"{len(times)}x at {' '.join(times)} UTC" if times else "never"


def partition_evidence(
    logs: Sequence[Path], topic: str, held: Sequence[Held], bounds: Mapping[int, tuple[int, int]]
) -> list[str]:
    """For each record holding the uuid: the partition's offsets no worker started, and
    the first commit past the record."""
    out = []
    for h in held:
        if h.topic != topic:
            continue
        gaps = never_started(logs, topic, h.partition, bounds[h.partition][1])
        past = committed_past(logs, topic, h.partition, h.offset)
        out.append(f"{topic}:{h.partition} offsets never started: {gaps[:50]}")
        out.append(f"first commit past {h.offset}: {past}")
    return out


async def output_evidence(bootstrap: str, uuid: str) -> list[str]:
    """The uuid's ends as a new group-less reader finds them now: an end there that the
    live reader never saw is a record the live reader's fetches skipped."""
    found = []
    for topic in (c.METADATA_TOPIC, c.LINK_ROT_TOPIC, c.CRAWL_ERRORS_TOPIC):
        records, _ = await read_all(bootstrap, topic)
        found += [f"re-read {topic}: {h}" for h in holding(records, uuid)]
    return found or ["re-read output topics: no end"]


async def diagnose(
    bootstrap: str,
    lost: Sequence[tuple[str, str, str]],
    request_log: Sequence[tuple[float, str]],
    logs: Sequence[Path],
) -> str:
    """The evidence for each lost (uuid, source, path), as text."""
    inbound, _ = await read_all(bootstrap, c.INBOUND_TOPIC)
    out: list[str] = []
    cache: dict[str, tuple[list[Any], dict[int, tuple[int, int]]]] = {}
    for uuid, source, path in lost:
        topic = c.source_topic(source)
        if topic not in cache:
            cache[topic] = await read_all(bootstrap, topic)
        records, bounds = cache[topic]
        held = holding(records, uuid)
        out.append(f"== {uuid} {source} {path}")
        out.append(f"origin asked: {requests_of(request_log, path)}")
        out += [f"inbound_images: {h}" for h in holding(inbound, uuid)] or ["inbound: none"]
        out += await output_evidence(bootstrap, uuid)
        out += [f"{topic}: {h}" for h in held] or [f"{topic}: no record holds it"]
        out += [f"kcat: {kcat_record(bootstrap, topic, h.partition, h.offset)}" for h in held]
        states = await partition_states(bootstrap, topic, bounds)
        out += [f"group {c.WORKER_GROUP}: {s}" for s in states]
        out += partition_evidence(logs, topic, held, bounds)
        out.append("timeline:")
        out += ["  " + line for line in timeline(logs, uuid, topic, held)]
    return "\n".join(out)


class CheckedOutputs(Outputs):
    """``Outputs`` that also notes every skip in a partition's offsets: records read past
    the position asked for, i.e. a fetch answer that left records out (the output topics
    are neither compacted nor transactional, so their offsets have no holes). A skipped
    offset is read again, once, as the workers and the compose check's reader do: tansu
    on S3 answers a fetch with a batch whose object it listed before an earlier one's
    (two workers publishing to a partition at once), and rep 7 of a run (seed 207) called
    a uuid lost whose message was at the offset skipped."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(bootstrap)
        self._next: dict[tuple[str, int], int] = {}
        self._reread: set[tuple[str, int, int]] = set()
        self.gaps: list[tuple[str, int, int, int, float]] = []

    async def _read(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        while True:
            for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                for record in records:
                    expected = self._next.get((tp.topic, tp.partition), 0)
                    if record.offset != expected:
                        self.gaps.append(
                            (tp.topic, tp.partition, expected, record.offset, time.time())
                        )
                        if (tp.topic, tp.partition, expected) not in self._reread:
                            self._reread.add((tp.topic, tp.partition, expected))
                            consumer.seek(tp, expected)
                            break
                    self._next[(tp.topic, tp.partition)] = record.offset + 1
                    self._add(record.topic, record.value, record.timestamp)
