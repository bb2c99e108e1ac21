"""The dataset comparison's verdicts and rows (``bench.dataset``'s figures), for
bench.report: issue 52's targets for ``image-crawler download`` beside img2dataset."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

# Issue 52's targets.
SUCCESSES_WITHIN: Final = 0.01  # on the hosts both may crawl, against img2dataset's
CPU_OVER_PEER_MAX: Final = 0.55  # CPU per image, start-up subtracted, over img2dataset's


def _row(target: str, value: float, limit: str, ok: bool, shown: str) -> dict[str, Any]:
    return {"target": target, "value": value, "shown": shown, "limit": limit, "ok": bool(ok)}


def dataset_verdicts(figures: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Successes on the hosts both may crawl, every row of the 429 host, nothing but
    robots.txt asked of the disallowing host, the same sizes, and CPU per image."""
    if not figures:
        return []
    compare = figures["compare"]
    rows: list[dict[str, Any]] = []
    both = compare["images_on_hosts_both_may_crawl"]
    ours, theirs = both["download"], both["img2dataset"]
    gap = abs(ours - theirs) / theirs if theirs else 1.0
    rows.append(
        _row(
            "download's successes on the hosts both may crawl / img2dataset's",
            gap,
            f"within {SUCCESSES_WITHIN:.0%}",
            gap <= SUCCESSES_WITHIN,
            f"{ours:,} / {theirs:,}",
        )
    )
    limited = compare["images_of_the_429_host"]
    rows_of = compare["rows_of_the_429_host"]
    rows.append(
        _row(
            "download's images of the host that answers 429 with Retry-After",
            limited["download"],
            f"= its {rows_of} rows",
            limited["download"] == rows_of,
            f"{limited['download']} (img2dataset {limited['img2dataset']})",
        )
    )
    asked = compare["requests_to_the_disallowed_host"]
    rows.append(
        _row(
            "download's requests to the host whose robots.txt disallows everything",
            asked["download"],
            "= 1 (its robots.txt)",
            asked["download"] == 1,
            f"{asked['download']} (img2dataset {asked['img2dataset']})",
        )
    )
    sizes = compare["sizes"]
    same = set(sizes["download"]) == set(sizes["img2dataset"])
    shown = ", ".join(sorted(sizes["download"])) or "-"
    rows.append(_row("download's image sizes = img2dataset's", float(same), "same", same, shown))
    ratio = compare["cpu_ratio"]
    if ratio is not None:
        rows.append(
            _row(
                "download's CPU per image / img2dataset's (start-up subtracted)",
                ratio,
                f"<= {CPU_OVER_PEER_MAX}",
                ratio <= CPU_OVER_PEER_MAX,
                f"{ratio:.2f}",
            )
        )
    return rows


def _roles(run: Mapping[str, Any]) -> str:
    spent = run["cpu_by_role_s"]
    total = sum(spent.values()) or 1.0
    return ", ".join(
        f"{role} {cpu / total:.0%}" for role, cpu in spent.items() if cpu / total >= 0.01
    )


def dataset_table(figures: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(figure, value) pairs: each tool's successes, 429s, CPU, wall time and burst."""
    if not figures:
        return []
    compare = figures["compare"]
    title = f"dataset, {figures['rows']:,} rows over {figures['hosts']} hosts"
    both = compare["images_on_hosts_both_may_crawl"]
    limited = compare["images_of_the_429_host"]
    cpu = compare["cpu_per_image_ms"]
    wall = compare["wall_s"]
    most = compare["most_requests_to_one_host_in_a_second"]
    rows = [
        (f"{title}: successes on the hosts both may crawl", _pair(both)),
        ("  images of the 429 host", _pair(limited, f" of {compare['rows_of_the_429_host']}")),
        ("  requests to the disallowing host", _pair(compare["requests_to_the_disallowed_host"])),
        ("  CPU per image (start-up subtracted)", _pair(cpu, " ms")),
        ("  wall time", _pair(wall, " s")),
        ("  most requests to one host in a second", _pair(most)),
        ("  where download's CPU went", _roles(figures["download"])),
    ]
    if unbound := figures.get("download_unbound"):
        rows.append(
            (
                "  download at 1000 requests/s a host: wall time, CPU per image",
                f"{unbound['wall_s']:,.1f} s, {unbound['cpu_per_image_ms']} ms",
            )
        )
    return rows


def _pair(values: Mapping[str, Any], unit: str = "") -> str:
    return f"download {values['download']}{unit}, img2dataset {values['img2dataset']}{unit}"
