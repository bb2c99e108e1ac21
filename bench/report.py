"""The benchmark's verdicts against the targets, and its short table (text and markdown)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from bench.dataset_report import dataset_table, dataset_verdicts
from bench.longtail_report import longtail_table, longtail_verdicts

GIB = 1024**3
MIB = 1024**2

# The targets of issue 6.
WORKER_OVER_KERNEL_MAX = 1.3
PEAK_RSS_MAX_BYTES = GIB
RSS_GROWTH_MAX = 1.10  # RSS at 100 % over RSS at 50 % of the run
SCALE_THROUGHPUT_MIN = 0.90  # many sources over one source
MONITOR_LOOP_MAX_S = 0.250  # at 10,000 sources
BROKER_CONNECTIONS_MAX = 4  # a producer and a consumer (bootstrap, coordinator, fetch)

# The targets of issue 19, on the corpus's "mixed" files (the re-encoded photos).
WORKER_OVER_PEER_MAX = 0.55  # worker CPU/image over img2dataset's (start-up subtracted)
WORKER_OVER_BARE_MAX = 1.35  # worker CPU/image over the bare Pillow pipeline's
PSNR_MEAN_MIN = 35.5  # dB, thumbnails against a full-decode Lanczos thumbnail
PSNR_WORST_MIN = 30.0

# The target of issue 30: the worker's CPU for a re-check of an unchanged image (a 304)
# over its CPU for a full crawl of it, per image, in the same run.
RECHECK_OVER_CRAWL_MAX = 0.10

# The target of issue 36: one source over 1,000 hosts at a robots.txt Crawl-delay of 1 s,
# over the same images on one unlimited host in the same run (steady throughput).
HOSTS_THROUGHPUT_MIN = 0.90


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:,.0f} MiB"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.1f} ms"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def run_kernel(result: dict[str, Any], run: dict[str, Any]) -> float:
    """The kernel CPU per image a crawl is compared with: the mean of the measurements
    just before and just after it (results of older benches have only the first)."""
    around = run.get("kernel_cpu_s_per_image")
    return float(around) if around else float(result["kernel"]["cpu_s_per_image"])


def verdicts(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target: what was measured, the limit, and whether it holds."""
    rows: list[dict[str, Any]] = []
    for run in result["runs"]:
        rows += _run_verdicts(result, run)
    rows += _scale_verdicts(result["runs"])
    rows += _monitor_verdicts(result.get("monitor", []))
    rows += _hosts_verdicts(result.get("hosts"))
    rows += longtail_verdicts(result.get("long_tail"))
    rows += _comparison_verdicts(result.get("comparison"))
    rows += dataset_verdicts(result.get("dataset"))
    rows += _quality_verdicts(result.get("quality"))
    return rows


def _run_verdicts(result: dict[str, Any], run: dict[str, Any]) -> list[dict[str, Any]]:
    """One crawl: worker over kernel, each worker's memory and connections, fairness."""
    rows = []
    name = f"{run['sources']} source(s)"
    per_image = run["worker_cpu_s_per_image"]
    kernel = run_kernel(result, run)
    if run["errors"]:
        # Failed images cost the worker little CPU and no kernel: no honest ratio.
        name += f", {sum(run['errors'].values())} errors"
    if per_image is not None:
        ratio = per_image / kernel
        rows.append(
            _row(
                f"worker CPU / kernel CPU per image, {name}",
                ratio,
                f"<= {WORKER_OVER_KERNEL_MAX}",
                ratio <= WORKER_OVER_KERNEL_MAX,
                f"{ratio:.2f}",
            )
        )
    rows += _recheck_verdicts(run.get("recheck"), f"{run['sources']} source(s)")
    for i, memory in enumerate(run["memory"]):
        rows += _memory_verdicts(i, memory, name)
    fairness = run.get("fairness")
    # With fewer than ~10 images a source, all of them start at once (3 slots each)
    # and the order they finish in says nothing about slots.
    if fairness and run["images_requested"] >= 10 * run["sources"]:
        half = fairness.get("at_50%", {})
        got = half.get("sources_with_completions", 0)
        rows.append(
            _row(
                f"sources with completed images at 50% of the run, {name}",
                got,
                f"all {run['sources']}",
                got == run["sources"],
                f"{got} of {run['sources']}",
            )
        )
    return rows


def _others(recheck: dict[str, Any]) -> dict[str, int]:
    """The re-checks that did not come back ``unchanged``, by status ("missing": none)."""
    statuses = recheck["statuses"]
    others = {k: v for k, v in sorted(statuses.items()) if k != "unchanged" and v}
    missing = recheck["images"] - sum(statuses.values())
    if missing:
        others["missing"] = missing
    return others


def _recheck_verdicts(recheck: dict[str, Any] | None, name: str) -> list[dict[str, Any]]:
    """Every re-check came back unchanged, and a re-check's CPU over a full crawl's."""
    if not recheck:
        return []
    images = recheck["images"]
    unchanged = recheck["statuses"].get("unchanged", 0)
    others = _others(recheck)
    detail = ", ".join(f"{k} {v}" for k, v in others.items())
    rows = [
        _row(
            f"re-checks of unchanged images that came back unchanged, {name}",
            unchanged,
            f"all {images}",
            unchanged == images,
            f"{unchanged} of {images}" + (f" ({detail})" if detail else ""),
        )
    ]
    ratio = recheck.get("ratio")
    if ratio is not None:
        where = name + (f", {sum(others.values())} not unchanged" if others else "")
        rows.append(
            _row(
                f"re-check CPU / full crawl CPU per image, {where}",
                ratio,
                f"<= {RECHECK_OVER_CRAWL_MAX}",
                ratio <= RECHECK_OVER_CRAWL_MAX,
                f"{ratio:.3f}",
            )
        )
    return rows


def _memory_verdicts(i: int, memory: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Worker ``i``'s peak and growing RSS, and its connections to the broker."""
    rows = []
    peak = memory["peak_rss_main_bytes"]
    rows.append(
        _row(
            f"peak RSS of worker {i} main process, {name}",
            peak,
            "< 1 GiB",
            peak < PEAK_RSS_MAX_BYTES,
            _mib(peak),
        )
    )
    held = memory.get("main_rss_plus_memfd_bytes_max")
    if held is not None:
        rows.append(
            _row(
                f"worker {i} main process RSS + bodies in memfds (max sampled), {name}",
                held,
                "< 1 GiB",
                held < PEAK_RSS_MAX_BYTES,
                _mib(held),
            )
        )
    pool = memory["peak_rss_pool_max_bytes"]
    rows.append(
        _row(
            f"peak RSS of worker {i}'s largest pool process, {name}",
            pool,
            "< 1 GiB",
            pool < PEAK_RSS_MAX_BYTES,
            _mib(pool),
        )
    )
    half, full = memory["rss_at"].get("50%"), memory["rss_at"].get("100%")
    if half and full and half["main_rss"]:
        growth = full["main_rss"] / half["main_rss"]
        rows.append(
            _row(
                f"worker {i} RSS growth 50% -> 100% of the run, {name}",
                growth,
                f"<= {RSS_GROWTH_MAX}",
                growth <= RSS_GROWTH_MAX,
                f"x{growth:.2f}",
            )
        )
    connections = memory["broker_connections_max"]
    if connections is not None:
        rows.append(
            _row(
                f"worker {i} TCP connections to the broker (max), {name}",
                connections,
                f"<= {BROKER_CONNECTIONS_MAX}",
                connections <= BROKER_CONNECTIONS_MAX,
                str(connections),
            )
        )
    return rows


def _scale_verdicts(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Throughput of each many-source crawl over the one-source crawl's."""
    rows = []
    single = next((r for r in runs if r["sources"] == 1), None)
    for run in runs:
        if single is None or run is single:
            continue
        a, b = run["images_per_s"], single["images_per_s"]
        if a and b:
            ratio = a / b
            rows.append(
                _row(
                    f"throughput {run['sources']} sources / 1 source (whole runs)",
                    ratio,
                    f">= {SCALE_THROUGHPUT_MIN}",
                    ratio >= SCALE_THROUGHPUT_MIN,
                    f"{ratio:.2f}",
                )
            )
    return rows


def _monitor_verdicts(loops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The monitor's loop with 10,000 sources, the usual traffic (not all failing)."""
    rows = []
    for loop in loops:
        if loop["sources"] == 10_000 and loop.get("failing_every") != 1:
            took = loop["loop_s_median"]
            rows.append(
                _row(
                    "monitor loop with 10,000 sources (median)",
                    took,
                    "< 250 ms",
                    took < MONITOR_LOOP_MAX_S,
                    _ms(took),
                )
            )
    return rows


def _hosts_verdicts(hosts: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The many-host crawl's steady throughput over the one-host crawl's."""
    if not hosts or hosts.get("ratio_steady_10_90") is None:
        return []
    ratio = hosts["ratio_steady_10_90"]
    errors = sum(hosts["many_hosts"]["errors"].values()) + sum(hosts["one_host"]["errors"].values())
    name = (
        f"throughput {hosts['hosts']:,} hosts at Crawl-delay {hosts['crawl_delay_s']:g} s "
        "/ 1 unlimited host (10%-90% of outputs)"
    )
    if errors:
        name += f", {errors} errors"
    limit = f">= {HOSTS_THROUGHPUT_MIN}"
    return [_row(name, ratio, limit, ratio >= HOSTS_THROUGHPUT_MIN, f"{ratio:.2f}")]


def _comparison_verdicts(comparison: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Worker over img2dataset and over the bare Pillow pipeline, on the mixed files."""
    if not comparison:
        return []
    rows = []
    worker = comparison.get("worker_cpu_s_per_image")
    crawl = comparison.get("crawl") or {}
    where = "mixed corpus"
    if crawl.get("errors"):
        where += f", {sum(crawl['errors'].values())} worker errors"
    peer = comparison.get("peer")
    if worker and peer and peer.get("cpu_s_per_image"):
        ratio = worker / peer["cpu_s_per_image"]
        name = where if peer.get("all_succeeded") else where + ", img2dataset had failures"
        rows.append(
            _row(
                f"worker CPU / img2dataset CPU per image, {name}",
                ratio,
                f"<= {WORKER_OVER_PEER_MAX}",
                ratio <= WORKER_OVER_PEER_MAX,
                f"{ratio:.2f}",
            )
        )
    bare = (comparison.get("bare") or {}).get("cpu_s_per_image")
    if worker and bare:
        ratio = worker / bare
        rows.append(
            _row(
                f"worker CPU / bare Pillow pipeline CPU per image, {where}",
                ratio,
                f"<= {WORKER_OVER_BARE_MAX}",
                ratio <= WORKER_OVER_BARE_MAX,
                f"{ratio:.2f}",
            )
        )
    return rows


def _quality_sets(quality: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, summary) of all files and of the mixed files, those that were measured."""
    sets = []
    every = quality.get("all") or {}
    if every.get("count"):
        sets.append((f"all {every['count']} files", every))
    mixed = (quality.get("by_kind") or {}).get("mixed") or {}
    if mixed.get("count"):
        sets.append((f"{mixed['count']} mixed files", mixed))
    return sets


def _quality_verdicts(quality: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not quality:
        return []
    rows = []
    for name, summary in _quality_sets(quality):
        mean, worst = summary["mean_db"], summary["worst_db"]
        rows.append(
            _row(
                f"thumbnail PSNR mean, {name}",
                mean,
                f">= {PSNR_MEAN_MIN} dB",
                mean >= PSNR_MEAN_MIN,
                f"{mean:.2f} dB",
            )
        )
        rows.append(
            _row(
                f"thumbnail PSNR worst image, {name}",
                worst,
                f">= {PSNR_WORST_MIN} dB",
                worst >= PSNR_WORST_MIN,
                f"{worst:.2f} dB ({summary['worst_file']})",
            )
        )
    return rows


def _row(target: str, value: float, limit: str, ok: bool, shown: str) -> dict[str, Any]:
    return {"target": target, "value": value, "shown": shown, "limit": limit, "ok": bool(ok)}


def table(result: dict[str, Any]) -> list[tuple[str, str]]:
    """(figure, value) pairs, in the order the issue lists them."""
    kernel = result["kernel"]
    corpus = result["corpus"]
    rows: list[tuple[str, str]] = [
        (
            "corpus",
            f"{corpus['files']} files from {corpus['photographs']} photographs, "
            f"median {corpus['size_bytes']['median'] / 1e6:.2f} MB, "
            f"{corpus['share_1_to_3_mb'] * 100:.0f}% in 1-3 MB",
        ),
        ("kernel CPU per image", _ms(kernel["cpu_s_per_image"])),
    ]
    measured = result.get("kernel_measurements", [])
    if len(measured) > 1:
        rows.append(
            (
                "  measured before each crawl and after the last",
                " / ".join(_ms(k["cpu_s_per_image"]) for k in measured),
            )
        )
    for run in result["runs"]:
        rows += _run_table(result, run)
    for loop in result.get("monitor", []):
        rows.append(
            (
                f"monitor loop, {loop['sources']:,} sources"
                + (", every one failing" if loop.get("failing_every") == 1 else ""),
                f"{_ms(loop['loop_s_median'])} wall, {_ms(loop['loop_cpu_s_median'])} CPU "
                f"(+ redis-server {loop.get('redis_version', '?')} "
                f"{_ms(loop['redis_server_cpu_s_per_loop'])})",
            )
        )
    rows += _hosts_table(result.get("hosts"))
    rows += longtail_table(result.get("long_tail"))
    rows += _comparison_table(result.get("comparison"))
    rows += dataset_table(result.get("dataset"))
    rows += _quality_table(result.get("quality"))
    return rows


def _run_table(result: dict[str, Any], run: dict[str, Any]) -> list[tuple[str, str]]:
    """One crawl's rows: CPU, throughput, errors, each worker's memory, fairness."""
    rows: list[tuple[str, str]] = []
    tag = f"[{run['sources']} src, {run['config']['workers']} wkr, {run['images_ok']} img]"
    per_image = run["worker_cpu_s_per_image"]
    around = run_kernel(result, run)
    rows += [
        (f"{tag} worker CPU per image", _ms(per_image)),
        (
            f"{tag}   of which main process (system part)",
            f"{_ms(run['worker_main_cpu_s_per_image'])}"
            f" ({_ms(run.get('worker_main_system_cpu_s_per_image'))})",
        ),
        (
            f"{tag}   of which pool + forkserver (system part)",
            f"{_ms(run['worker_children_cpu_s_per_image'])}"
            f" ({_ms(run.get('worker_children_system_cpu_s_per_image'))})",
        ),
        (
            f"{tag} worker / kernel (kernel around this crawl)",
            f"{_num(per_image / around, 2)} ({_ms(around)})" if per_image else "-",
        ),
        (f"{tag} images per worker CPU second", _num(run["images_per_worker_cpu_s"])),
        (f"{tag} throughput (whole run)", f"{_num(run['images_per_s'])} images/s"),
        (
            f"{tag} throughput (10%-90% of outputs)",
            f"{_num(run['images_per_s_steady_10_90'])} images/s",
        ),
        (
            f"{tag} first / last output after",
            f"{_num(run['completed_by_s'].get('1%'))} s / "
            f"{_num(run['completed_by_s'].get('100%'))} s",
        ),
        (f"{tag} errors", str(run["errors"] or "none")),
    ]
    rows += _recheck_table(run.get("recheck"), tag)
    for i, memory in enumerate(run["memory"]):
        rows += _worker_memory_rows(memory, f"{tag} worker {i}")
    fairness = run.get("fairness")
    if fairness:
        half = fairness.get("at_50%", {})
        rows.append(
            (
                f"{tag} sources served by 50% of the run",
                f"{half.get('sources_with_completions')} of {run['sources']} "
                f"(per source {half.get('completions_per_source_min')}-"
                f"{half.get('completions_per_source_max')} done)",
            )
        )
    others = ", ".join(f"{k} {v:.1f}" for k, v in sorted(run["other_cpu_s"].items()))
    rows.append((f"{tag} other processes' CPU s", others))
    return rows


def _worker_memory_rows(memory: dict[str, Any], label: str) -> list[tuple[str, str]]:
    """One worker's memory rows: peak and sampled RSS, pool, memfds, broker connections."""
    at = memory["rss_at"]
    rss = " / ".join(_mib(at[k]["main_rss"]) if at.get(k) else "-" for k in ("10%", "50%", "100%"))
    return [
        (
            f"{label} peak RSS main / largest pool process",
            f"{_mib(memory['peak_rss_main_bytes'])} / {_mib(memory['peak_rss_pool_max_bytes'])}",
        ),
        (f"{label} RSS at 10% / 50% / 100%", rss),
        (
            f"{label} pool processes; bodies in memfds (max)",
            f"{memory['pool_processes']}; {_mib(memory.get('memfd_bytes_max'))}",
        ),
        (f"{label} broker connections (max)", str(memory["broker_connections_max"])),
    ]


def _recheck_table(recheck: dict[str, Any] | None, tag: str) -> list[tuple[str, str]]:
    """The re-check pass's rows: its CPU beside the full crawl's, and what came back."""
    if not recheck:
        return []
    ratio = recheck.get("ratio")
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(recheck["statuses"].items())) or "none"
    http = ", ".join(f"{k} {v}" for k, v in sorted(recheck["http_statuses"].items())) or "none"
    rows = [
        (
            f"{tag} re-check CPU per image (main + pool)",
            f"{_ms(recheck['cpu_s_per_image'])} ({_ms(recheck['main'])} + {_ms(recheck['pool'])})",
        ),
        (
            f"{tag} full crawl CPU per image; re-check / full crawl",
            f"{_ms(recheck['full_crawl_cpu_s_per_image'])}; {_num(ratio, 3)}",
        ),
        (
            f"{tag} re-checks: statuses (HTTP)",
            f"{statuses} of {recheck['rechecks']} ({http})",
        ),
        (
            f"{tag} re-check throughput; last after",
            f"{_num(recheck['checks_per_s'])} checks/s; "
            f"{_num(recheck['completed_by_s'].get('100%'))} s",
        ),
    ]
    skipped = recheck["not_rechecked"]
    if any(skipped.values()) or recheck["resolutions"] or recheck["errors"]:
        rows.append(
            (
                f"{tag} re-check: not re-checked; resolutions, errors during",
                f"{skipped['no_resolution']} without a resolution, "
                f"{skipped['no_validators']} without validators; "
                f"{recheck['resolutions']}, {recheck['errors'] or 'none'}",
            )
        )
    return rows


def _hosts_table(hosts: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The one-host and many-host crawls side by side, what the origin was asked, and
    the ratio of their throughputs."""
    if not hosts:
        return []
    rows: list[tuple[str, str]] = []
    many = f"[{hosts['hosts']:,} hosts, Crawl-delay {hosts['crawl_delay_s']:g} s]"
    for run, tag in ((hosts["one_host"], "[1 unlimited host]"), (hosts["many_hosts"], many)):
        requests = run.get("origin_requests") or {}
        asked = ", ".join(
            f"{kind} {n:,} ({requests['per_s'].get(kind, 0):,.1f}/s)"
            for kind, n in requests.get("by_kind", {}).items()
        )
        rows += [
            (
                f"{tag} worker CPU per image (main + pool)",
                f"{_ms(run['worker_cpu_s_per_image'])} ({_ms(run['worker_main_cpu_s_per_image'])}"
                f" + {_ms(run['worker_children_cpu_s_per_image'])})",
            ),
            (
                f"{tag} throughput 10%-90% / whole run",
                f"{_num(run['images_per_s_steady_10_90'])} / {_num(run['images_per_s'])} images/s",
            ),
            (
                f"{tag} first / last output after; errors",
                f"{_num(run['completed_by_s'].get('1%'))} s / "
                f"{_num(run['completed_by_s'].get('100%'))} s; {run['errors'] or 'none'}",
            ),
            (f"{tag} origin requests (measured window)", asked or "-"),
        ]
        warnings = Counter[str]()
        for counts in run.get("worker_log_warnings") or []:
            warnings.update(counts)
        if warnings:
            shown = ", ".join(f"{k} {n:,}" for k, n in sorted(warnings.items()))
            rows.append((f"{tag} worker log warnings and errors", shown))
    rows += _delayed_hosts_rows(hosts)
    rows.append(
        (
            "hosts / one host: throughput 10%-90% (whole run)",
            f"{_num(hosts['ratio_steady_10_90'], 2)} ({_num(hosts['ratio_whole_run'], 2)})",
        )
    )
    return rows


def _delayed_hosts_rows(hosts: dict[str, Any]) -> list[tuple[str, str]]:
    """How the Crawl-delayed hosts were asked, as the origin saw it (warm-up included)."""
    seen = (hosts["many_hosts"].get("origin_requests") or {}).get("delayed_hosts") or {}
    if not seen.get("hosts_asked"):
        return []
    gap = seen.get("min_gap_s")
    rows = [
        (
            "Crawl-delayed hosts asked; requests per host",
            f"{seen['hosts_asked']:,} of {hosts['hosts']:,}; "
            f"{seen['requests_per_host_min']}-{seen['requests_per_host_max']}",
        ),
        (
            "gaps between a host's requests under its Crawl-delay / under 0.9 of it; shortest",
            f"{seen['gaps_under_delay']:,} / {seen['gaps_under_90_percent']:,} of "
            f"{seen['gaps']:,} (at {seen.get('hosts_under_90_percent', '-')} hosts); "
            f"{'-' if gap is None else f'{gap:.3f} s'}",
        ),
    ]
    at = seen.get("gap_s_at") or {}
    if at:
        rows.append(
            (
                f"gaps between a host's requests at {' / '.join(at)} of them",
                " / ".join(f"{v:.3f}" for v in at.values()) + " s",
            )
        )
    return rows


def _around(figure: dict[str, Any] | None) -> str:
    """A figure measured before and after the comparison: "mean (before / after)"."""
    if not figure:
        return "-"
    measured = figure.get("measurements") or []
    each = " / ".join(_ms(m["cpu_s_per_image"]) for m in measured)
    return f"{_ms(figure['cpu_s_per_image'])}" + (f" ({each})" if len(measured) > 1 else "")


def _comparison_table(comparison: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not comparison:
        return []
    corpus = comparison["corpus"]
    rows = [
        (
            "comparison corpus (mixed files)",
            f"{corpus['files']} files, mean {corpus['size_bytes']['mean'] / 1e3:,.0f} KB, "
            f"long side {corpus['long_side_px'][0]}-{corpus['long_side_px'][1]} px, "
            f"quality {corpus['quality'][0]}-{corpus['quality'][1]}",
        )
    ]
    peer = comparison.get("peer")
    if peer:
        per_repeat = " / ".join(_ms(x) for x in peer["cpu_s_per_image_by_repeat"])
        checked = peer.get("thumbnails_checked", {})
        bad = sum(checked.get(k, 0) for k in ("not_jpeg", "wrong_size", "luma_table_not_quality"))
        rows += [
            (
                f"img2dataset {peer['version']} CPU per image (start-up subtracted)",
                f"{_ms(peer['cpu_s_per_image'])} (median of {peer['repeats']}: {per_repeat})",
            ),
            (
                "img2dataset start-up CPU (subtracted); thumbnails",
                f"{peer['startup_cpu_s']:.2f} s; "
                f"{'all' if peer['all_succeeded'] else 'NOT all'} of "
                f"{peer['images']} x {peer['repeats']} made, {bad} off 640 px / q85, "
                f"mean {checked.get('bytes_mean', 0) / 1e3:.1f} KB",
            ),
        ]
    else:
        rows.append(("img2dataset CPU per image", "not measured (--no-peer)"))
    rows += [
        ("bare Pillow pipeline CPU per image (before / after)", _around(comparison.get("bare"))),
        ("kernel CPU per image, mixed files (before / after)",
         _around(comparison.get("kernel_on_mixed"))),
    ]  # fmt: skip
    crawl = comparison.get("crawl")
    if crawl:
        tag = f"[mixed, 1 src, {crawl['config']['workers']} wkr, {crawl['images_ok']} img]"
        rows += [
            (
                f"{tag} worker CPU per image (main + pool)",
                f"{_ms(crawl['worker_cpu_s_per_image'])} "
                f"({_ms(crawl['worker_main_cpu_s_per_image'])} + "
                f"{_ms(crawl['worker_children_cpu_s_per_image'])})",
            ),
            (f"{tag} throughput; errors",
             f"{_num(crawl['images_per_s'])} images/s; {crawl['errors'] or 'none'}"),
        ]  # fmt: skip
    ratios = comparison.get("ratios") or {}
    for key, label in (
        ("worker_over_peer", "worker / img2dataset"),
        ("worker_over_bare", "worker / bare Pillow"),
        ("kernel_over_bare", "kernel / bare Pillow"),
    ):
        if ratios.get(key) is not None:
            rows.append((f"{label} (CPU per image, mixed)", _num(ratios[key], 2)))
    return rows


def _quality_table(quality: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not quality:
        return []
    return [
        (
            f"thumbnail PSNR, {name}: mean / worst / under 30 dB",
            f"{s['mean_db']:.2f} / {s['worst_db']:.2f} dB ({s['worst_file']}) / {s['under_30_db']}",
        )
        for name, s in _quality_sets(quality)
    ]


def render_text(result: dict[str, Any]) -> str:
    rows = table(result)
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines.append("")
    for v in result["verdicts"]:
        lines.append(f"{'PASS' if v['ok'] else 'FAIL'}  {v['target']}: {v['shown']} ({v['limit']})")
    return "\n".join(lines)


def render_markdown(result: dict[str, Any]) -> str:
    machine = result["machine"]
    lines = [
        f"Benchmark of {result['started']} on {machine['cpus']} CPUs ({machine['cpu_model']}), "
        f"load average at start {machine['load_average_at_start']}.",
        "",
        "| figure | value |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {v} |" for k, v in table(result)]
    lines += ["", "| target | measured | limit | verdict |", "| --- | --- | --- | --- |"]
    lines += [
        f"| {v['target']} | {v['shown']} | {v['limit']} | {'pass' if v['ok'] else 'FAIL'} |"
        for v in result["verdicts"]
    ]
    return "\n".join(lines) + "\n"
