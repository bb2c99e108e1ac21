"""The long tail's rows and verdict (``bench.longtail``'s figures), for bench.report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from bench.longtail import ONE_HOST_FAMILY, TAIL_FAMILY

# The target: the long tail at 80 % of one host's images/s, on this machine.
LONG_TAIL_THROUGHPUT_MIN: Final = 0.80
MIB: Final = 1024**2


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f} ms"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _errors(figures: Mapping[str, Any]) -> int:
    return sum(figures["one_host"]["errors"].values()) + sum(
        figures["long_tail"]["errors"].values()
    )


# Other processes' share of the CPUs over a crawl from which its verdict says so: the
# ratio then also measures how the machine was shared.
DISTURBED_SHARE: Final = 0.05


def _unfinished(costs: Mapping[str, Any]) -> str:
    """Says that a crawl's window closed at its timeout: its images/s are those of the
    images done by then."""
    return (
        f"timed out after {costs['images_ok']:,} of {costs['images_requested']:,} images "
        f"({costs['wall_s']:,.0f} s)"
    )


def _others_share(costs: Mapping[str, Any]) -> float:
    """The share of the machine's CPUs that processes not ours kept busy."""
    machine, ours = costs.get("cpu_share_machine"), costs.get("cpu_share_ours")
    return max(0.0, machine - ours) if machine is not None and ours is not None else 0.0


def longtail_verdicts(figures: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The long tail's images/s over one host's, whole runs: at least 0.80."""
    if not figures or figures.get("ratio") is None:
        return []
    ratio = figures["ratio"]
    name = f"throughput {figures['hosts']:,} new hosts / 1 host (whole run)"
    if errors := _errors(figures):
        name += f", {errors} errors"
    for run in ("one_host", "long_tail"):
        if not (costs := figures["costs"][run]).get("finished", True):
            name += f", {_unfinished(costs)}"
    others = [_others_share(figures["costs"][run]) for run in ("one_host", "long_tail")]
    if max(others) >= DISTURBED_SHARE:
        name += (
            f", other processes busy {others[0]:.0%} / {others[1]:.0%} of the CPUs "
            f"(CPU alone allows {_num(figures['shortfall']['ratio_cpu_bound'], 2)})"
        )
    return [
        {
            "target": name,
            "value": ratio,
            "shown": f"{ratio:.2f}",
            "limit": f">= {LONG_TAIL_THROUGHPUT_MIN}",
            "ok": ratio >= LONG_TAIL_THROUGHPUT_MIN,
        }
    ]


def _per_kind(costs: Mapping[str, Any]) -> str:
    wall_s = costs["wall_s"]
    return ", ".join(
        f"{kind} {n:,} ({costs['requests_per_image'][kind]:.2f}/image, "
        f"{n / wall_s if wall_s else 0:,.1f}/s)"
        for kind, n in sorted(costs["requests"].items())
        if n
    )


def _dns(queries: Mapping[str, int] | None, images: int) -> str:
    if not queries:
        return "none"
    by_type = {k: n for k, n in queries.items() if k != "names"}
    total = sum(by_type.values())
    shown = ", ".join(f"{k} {n:,}" for k, n in by_type.items())
    per_image = f"{total / images:.2f}" if images else "-"
    return f"{total:,} ({shown}) for {queries.get('names', 0):,} names; {per_image}/image"


def _redis(run: Mapping[str, Any]) -> tuple[str, str]:
    redis = run.get("redis") or {}
    top = ", ".join(
        f"{name} {c['per_image']:.2f}" for name, c in list((redis.get("top") or {}).items())[:8]
    )
    before, after = redis.get("used_memory_before"), redis.get("used_memory_after")
    memory = (
        f"{before / MIB:.1f} -> {after / MIB:.1f} MiB, {after - before:+,} bytes; "
        f"keys {redis.get('keys_before')} -> {redis.get('keys_after')}"
        if before is not None and after is not None
        else "-"
    )
    return f"{_num(redis.get('commands_per_image'), 2)} ({top})", memory


def _cpu(costs: Mapping[str, Any]) -> str:
    parts = ", ".join(
        f"{name} {s * 1000:.2f}" for name, s in costs["cpu_s_per_image"].items() if s is not None
    )
    return f"{_ms(costs['cpu_s_per_image_total'])}: {parts}"


def _origin_tail(tail: Mapping[str, Any]) -> list[tuple[str, str]]:
    if not tail:
        return []
    gaps = "; ".join(
        f"{step} {g['median']:.3f} / {g['p90']:.3f} s"
        for step, g in sorted((tail.get("gaps_s") or {}).items())
    )
    asked = ", ".join(f"{n} requests: {h:,}" for n, h in tail["requests_per_host"].items())
    again = tail.get("hosts_asked_again") or {}
    return [
        ("  hosts asked; by requests per host", f"{tail['hosts']:,}; {asked}"),
        ("  hosts asked a kind more than once", ", ".join(f"{k} {n:,}" for k, n in again.items())
         or "none"),
        ("  a host's gaps between requests, median / 90th percentile", gaps or "-"),
    ]  # fmt: skip


def _run_rows(
    tag: str, run: Mapping[str, Any], costs: Mapping[str, Any], dns: Mapping[str, int] | None
) -> list[tuple[str, str]]:
    commands, memory = _redis(run)
    worker_memory = run["memory"][0] if run.get("memory") else {}
    rows = [
        (
            f"{tag} images/s whole run / 10%-90%; errors",
            f"{_num(costs['images_per_s'])} / {_num(costs['images_per_s_steady_10_90'])}; "
            f"{costs['errors'] or 'none'}"
            + ("" if costs.get("finished", True) else f"; {_unfinished(costs)}"),
        ),
        (f"{tag} requests/s (all kinds)", _num(costs["requests_per_s"])),
        (f"{tag}   by kind (per image, per s)", _per_kind(costs) or "-"),
        (f"{tag} DNS queries at dnsmasq", _dns(dns, costs["images_ok"])),
        (f"{tag} Redis commands per image (top)", commands),
        (f"{tag} Redis used memory (before -> after the window)", memory),
        (
            f"{tag} worker peak RSS, main / largest pool process",
            f"{worker_memory.get('peak_rss_main_bytes', 0) / MIB:.0f} / "
            f"{worker_memory.get('peak_rss_pool_max_bytes', 0) / MIB:.0f} MiB",
        ),
        (f"{tag} CPU per image, all processes (ms each)", _cpu(costs)),
        (
            f"{tag} CPUs busy: our processes / the whole machine",
            f"{_num((costs['cpu_share_ours'] or 0) * 100, 0)}% / "
            f"{_num((costs['cpu_share_machine'] or 0) * 100, 0)}%",
        ),
    ]
    return rows + [(f"{tag}{k}", v) for k, v in _origin_tail(costs["origin_tail"])]


def _shortfall_rows(figures: Mapping[str, Any]) -> list[tuple[str, str]]:
    account = figures["shortfall"]
    more = account["cpu_s_per_image_more"]
    shares = account["share_of_more"]
    cpu = ", ".join(
        f"{name} {s * 1000:+.2f} ({shares.get(name, 0) * 100:.0f}%)"
        for name, s in more.items()
        if abs(s) >= 0.00001
    )
    requests = ", ".join(
        f"{kind} {n:+.2f}" for kind, n in account["requests_per_image_more"].items() if n
    )
    return [
        ("long tail / one host: images/s whole run (10%-90%)",
         f"{_num(figures['ratio'], 2)} ({_num(figures['ratio_steady_10_90'], 2)})"),
        ("  the rest: CPU per image more on the long tail, ms (share)",
         f"{_ms(account['cpu_s_per_image_more_total'])}: {cpu}"),
        ("  the ratio the CPU per image alone allows (one host's / long tail's)",
         f"{_num(account['ratio_cpu_bound'], 2)}; without the origin's CPU (the servers' "
         f"work) {_num(account.get('ratio_cpu_bound_without_origin'), 2)}"),
        ("  the share of the CPUs our processes got (long tail's / one host's)",
         _num(account.get("ratio_cpu_share"), 2)),
        ("  image processes' CPU per image, long tail's / one host's (the same work: "
         "the machine's speed between the two crawls)",
         _num(account.get("pool_cpu_long_tail_over_one_host"), 3)),
        ("  requests per image more", requests or "-"),
        ("  Redis commands per image more", f"{account['redis_commands_per_image_more']:+.2f}"),
        ("  worker peak RSS (main process) beyond the one host's, per host",
         f"{_num(figures.get('worker_rss_bytes_per_host'), 0)} bytes"),
        ("  Redis bytes per host: beyond the one host's growth (all of the growth)",
         f"{_num(figures.get('redis_bytes_per_host'), 0)} "
         f"({_num(figures.get('redis_bytes_per_host_gross'), 0)})"),
    ]  # fmt: skip


def longtail_table(figures: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """Both crawls' rows, then the ratio and the account of where the rest goes."""
    if not figures:
        return []
    costs, dns = figures["costs"], figures["dns_queries"]
    rows = [
        ("long tail: URLs; hosts", f"{figures['urls']:,}; {figures['hosts']:,} (and 1)"),
        ("long tail: the web server", figures.get("origin") or "bench.origin (aiohttp)"),
    ]
    rows += _run_rows("[1 host]", figures["one_host"], costs["one_host"], dns.get(ONE_HOST_FAMILY))
    rows += _run_rows(
        f"[{figures['hosts']:,} hosts]", figures["long_tail"], costs["long_tail"],
        dns.get(TAIL_FAMILY),
    )  # fmt: skip
    return rows + _shortfall_rows(figures)
