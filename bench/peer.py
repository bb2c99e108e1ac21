"""The peer: img2dataset's CPU per image on the files the worker is compared on.

img2dataset (the tool people use to download and resize images in bulk; OpenCV inside)
runs in a virtual environment of its own, made by ``ensure_img2dataset`` in a cache
folder (default ``~/.cache/image-crawler-bench/img2dataset-1.47.0``) with
``python -m venv`` and ``pip install -c bench/peers/img2dataset-1.47.0.txt
img2dataset==1.47.0``: the pins (its venv's ``pip freeze``) fix the OpenCV and numpy
that set its speed. A marker written last records version, pins and Python; a folder
whose marker does not match is made again.

``measure_img2dataset`` runs the ``img2dataset`` command on URLs of the benchmark's
origin (``{origin}/{i}/{uuid}.jpg``, i from 0, the crawl's shape) with the settings of
the worker's thumbnails: 640 px on the long side, never upscaled, JPEG quality 85; one
process, 16 download threads, no hash, EXIF read, no retries, files written. Its CPU is
that of its whole process tree: ``os.wait4`` gives the command's own process plus every
descendant it reaped (its pool process and its logger process), and psutil reads any
descendant still alive when it exits (multiprocessing's resource tracker).

It cannot run on an empty URL list, so its fixed start-up (three interpreters importing
pandas, pyarrow, OpenCV, albumentations, wandb: about 3.5 CPU s) is measured with a
1-image run and subtracted: per repeat, a 1-image run and an N-image run in alternating
order, and per image = (CPU of N run - CPU of 1 run) / (thumbnails of N run -
thumbnails of 1 run). The figure is the median over the repeats.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import psutil

VERSION: Final = "1.47.0"
PINS: Final = Path(__file__).resolve().parent / "peers" / f"img2dataset-{VERSION}.txt"
DEFAULT_CACHE: Final = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "image-crawler-bench"
    / f"img2dataset-{VERSION}"
)
MARKER: Final = ".bench-complete.json"
SIZE: Final = 640
QUALITY: Final = 85
THREADS: Final = 16

# libjpeg's standard luminance table (Annex K), in natural order.
_STD_LUMA: Final = (
    16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55,
    14, 13, 16, 24, 40, 57, 69, 56, 14, 17, 22, 29, 51, 87, 80, 62,
    18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
    49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99,
)  # fmt: skip


class PeerError(RuntimeError):
    """img2dataset could not be installed or run."""


def luma_table(quality: int) -> list[int]:
    """libjpeg's luminance quantisation table for ``quality`` (natural order)."""
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    return [min(255, max(1, (q * scale + 50) // 100)) for q in _STD_LUMA]


# --- the virtual environment -------------------------------------------------------------


def _wanted_marker(version: str, pins: Path) -> dict[str, str]:
    return {
        "img2dataset": version,
        "pins_sha256": hashlib.sha256(pins.read_bytes()).hexdigest(),
        "python": platform.python_version(),
    }


def _read_marker(venv: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((venv / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def executable(venv: Path) -> Path:
    return venv / "bin" / "img2dataset"


def ensure_img2dataset(
    venv: Path = DEFAULT_CACHE,
    *,
    version: str = VERSION,
    pins: Path = PINS,
    log: Path | None = None,
) -> dict[str, Any]:
    """The venv at ``venv`` with img2dataset ``version``, made first when missing or when
    its marker does not match (version, sha256 of ``pins``, Python version).

    Returns where it is, whether it was installed now and how long that took.
    """
    wanted = _wanted_marker(version, pins)
    if executable(venv).exists() and _read_marker(venv) == wanted:
        return {"venv": str(venv), "installed_now": False, **wanted}
    if venv.exists():
        # Only ever delete what looks like a virtual environment (a --peer-cache typo
        # must not cost a folder).
        if not (venv / "pyvenv.cfg").is_file() and any(venv.iterdir()):
            raise PeerError(f"{venv} exists and is not a virtual environment; not touching it")
        shutil.rmtree(venv)
    started = time.monotonic()
    venv.parent.mkdir(parents=True, exist_ok=True)
    _install(venv, version, pins, log)
    (venv / MARKER).write_text(json.dumps(wanted))  # last: a half-made venv has none
    return {
        "venv": str(venv),
        "installed_now": True,
        "install_s": round(time.monotonic() - started, 1),
        **wanted,
    }


def _install(venv: Path, version: str, pins: Path, log: Path | None) -> None:
    commands = [
        [sys.executable, "-m", "venv", str(venv)],
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--quiet",
            "-c",
            str(pins),
            f"img2dataset=={version}",
        ],
    ]
    for command in commands:
        result = subprocess.run(command, capture_output=True, text=True)
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a") as out:
                out.write(f"$ {' '.join(command)}\n{result.stdout}{result.stderr}\n")
        if result.returncode != 0:
            raise PeerError(
                f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-2000:]}"
            )


def venv_packages(venv: Path) -> dict[str, str]:
    """``pip list`` of the venv, name -> version."""
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json",
         "--disable-pip-version-check"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout  # fmt: skip
    return {p["name"]: p["version"] for p in json.loads(out)}


# --- one run -------------------------------------------------------------------------


def img2dataset_command(
    exe: Path, url_list: Path, out: Path, *, threads: int = THREADS
) -> list[str]:
    return [
        str(exe),
        "--url_list", str(url_list),
        "--input_format", "txt",
        "--output_folder", str(out),
        "--output_format", "files",
        "--image_size", str(SIZE),
        "--resize_mode", "keep_ratio_largest",  # the long side; keep_ratio is the short one
        "--resize_only_if_bigger", "True",
        "--encode_format", "jpg",
        "--encode_quality", str(QUALITY),
        "--processes_count", "1",
        "--distributor", "multiprocessing",
        "--thread_count", str(threads),
        "--number_sample_per_shard", "10000",
        "--compute_hash", "None",
        "--extract_exif", "True",
        "--retries", "0",
        "--timeout", "30",
        "--enable_wandb", "False",
        # A fresh folder each run: "overwrite" deletes its own _tmp and fails.
        "--incremental_mode", "incremental",
    ]  # fmt: skip


def img2dataset_env() -> dict[str, str]:
    """A clean environment: no PYTHONPATH (the venv cannot import the project)."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TERM")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(
        # albumentations asks the package index for a newer version at every import
        # (three processes): traffic and time that are no part of the work.
        NO_ALBUMENTATIONS_UPDATE="1",
        WANDB_MODE="disabled",
        WANDB_SILENT="true",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


class TreeSampler:
    """The last CPU reading of every process seen in the tree, every ``interval`` s (for
    the descendants still alive after the command exits, and the split by process)."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid = pid
        self.root = psutil.Process(pid)
        self.cpu: dict[int, float] = {}
        self.procs: dict[int, psutil.Process] = {}
        # Each process's command line as first seen (a process gone later has none).
        self.cmdlines: dict[int, list[str]] = {}
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.read()

    def read(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            if p.pid not in self.procs:
                self.procs[p.pid] = p
                with contextlib.suppress(psutil.Error):
                    self.cmdlines[p.pid] = p.cmdline()
            self.cpu[p.pid] = max(self.cpu.get(p.pid, 0.0), t.user + t.system)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def survivors_cpu(self) -> float:
        """CPU of descendants still alive after the command was reaped (not in wait4)."""
        total = 0.0
        for pid, p in self.procs.items():
            if pid == self.pid:
                continue
            try:
                if p.is_running():
                    t = p.cpu_times()
                    total += t.user + t.system
            except psutil.Error:
                continue
        return total


def run_once(
    exe: Path,
    urls: Sequence[str],
    run_dir: Path,
    *,
    threads: int = THREADS,
    timeout_s: float = 600.0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the command once on ``urls`` in ``run_dir`` (made anew) and read its CPU and
    its ``*_stats.json``. Raises ``PeerError`` when it fails or times out."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    url_list = run_dir / "urls.txt"
    url_list.write_text("".join(f"{u}\n" for u in urls))
    out = run_dir / "out"
    command = img2dataset_command(exe, url_list, out, threads=threads)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    with (run_dir / "img2dataset.log").open("wb") as log:
        proc = subprocess.Popen(
            command,
            cwd=run_dir,
            env=env if env is not None else img2dataset_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed whole on a timeout
        )
        sampler = TreeSampler(proc.pid)
        status, usage = wait4(proc, started + timeout_s)
    wall = time.monotonic() - started
    sampler.stop()
    orphans = sampler.survivors_cpu()
    if status is None:
        raise PeerError(f"img2dataset ran over {timeout_s:.0f} s; see {run_dir}/img2dataset.log")
    if proc.returncode != 0:
        raise PeerError(f"img2dataset exited {proc.returncode}; see {run_dir}/img2dataset.log")
    stats = [json.loads(p.read_text()) for p in sorted(out.glob("*_stats.json"))]
    return {
        "images": len(urls),
        "successes": sum(s.get("successes", 0) for s in stats),
        "failed_to_download": sum(s.get("failed_to_download", 0) for s in stats),
        "failed_to_resize": sum(s.get("failed_to_resize", 0) for s in stats),
        "cpu_s": usage.ru_utime + usage.ru_stime + orphans,
        "user_s": round(usage.ru_utime, 3),
        "system_s": round(usage.ru_stime, 3),
        "orphans_cpu_s": round(orphans, 3),
        "processes_seen": len(sampler.procs),
        "wall_s": round(wall, 2),
        "load_avg_1m_before": round(load_before, 2),
        "out": str(out),
        "command": command,
    }


def wait4(proc: subprocess.Popen[bytes], deadline: float) -> tuple[int | None, Any]:
    """``os.wait4`` the process (its CPU and that of every descendant it reaped); kill
    its process group at the deadline. Returns (status or None on timeout, rusage)."""
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(max(0.0, deadline - time.monotonic()), kill)
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return (None if killed.is_set() else status), usage


def check_thumbnails(out: Path, size: int = SIZE, quality: int = QUALITY) -> dict[str, Any]:
    """Every thumbnail of a run: a JPEG, long side min(size, the original's), and
    libjpeg's luminance table for ``quality``. Reads headers only."""
    from PIL import Image

    want = luma_table(quality)
    files = sorted(out.glob("*/*.jpg"))
    wrong_size: list[tuple[str, tuple[int, int]]] = []
    wrong_table = not_jpeg = total_bytes = 0
    for f in files:
        total_bytes += f.stat().st_size
        with Image.open(f) as im:
            if im.format != "JPEG":
                not_jpeg += 1
                continue
            meta = json.loads(f.with_suffix(".json").read_text())
            want_side = min(size, max(meta["original_width"], meta["original_height"]))
            if max(im.size) != want_side:
                wrong_size.append((f.name, im.size))
            tables = getattr(im, "quantization", None) or {}
            if list(tables.get(0, [])) != want:
                wrong_table += 1
    return {
        "thumbnails": len(files),
        "not_jpeg": not_jpeg,
        "wrong_size": len(wrong_size),
        "wrong_size_examples": wrong_size[:5],
        "luma_table_not_quality": wrong_table,
        "bytes_mean": round(total_bytes / len(files)) if files else 0,
    }


# --- the measurement ---------------------------------------------------------------------


def per_image_figures(pairs: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """From (base run, N run) readings: CPU s per image and start-up CPU s per repeat,
    their medians, and the same from the median N run less the median base run."""
    per_image, startup = [], []
    for base, big in pairs:
        done = big["successes"] - base["successes"]
        if done <= 0:
            raise PeerError(f"no more thumbnails in the N run ({big['successes']}) than in "
                            f"the start-up run ({base['successes']})")  # fmt: skip
        per = (big["cpu_s"] - base["cpu_s"]) / done
        per_image.append(per)
        startup.append(base["cpu_s"] - base["successes"] * per)
    base_cpu = statistics.median(b["cpu_s"] for b, _ in pairs)
    big_cpu = statistics.median(n["cpu_s"] for _, n in pairs)
    done_median = statistics.median(n["successes"] - b["successes"] for b, n in pairs)
    return {
        "cpu_s_per_image": statistics.median(per_image),
        "cpu_s_per_image_by_repeat": per_image,
        # One slow start-up (+-0.5 s on a shared machine) moves this one less.
        "cpu_s_per_image_of_medians": (big_cpu - base_cpu) / done_median,
        "startup_cpu_s": statistics.median(startup),
        "startup_cpu_s_by_repeat": startup,
    }


def _checks_summed(checks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``check_thumbnails`` of several runs as one."""
    counts = ("thumbnails", "not_jpeg", "wrong_size", "luma_table_not_quality")
    return {
        **{key: sum(c[key] for c in checks) for key in counts},
        "bytes_mean": round(statistics.mean(c["bytes_mean"] for c in checks)),
    }


def measure_img2dataset(
    venv: Path,
    origin_url: str,
    *,
    images: int,
    work_dir: Path,
    repeats: int = 3,
    base: int = 1,
    threads: int = THREADS,
    timeout_s: float | None = None,
    keep: bool = False,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """img2dataset's CPU per image on ``images`` URLs of ``origin_url``, its start-up
    subtracted (see the module's doc); ``repeats`` pairs of runs, median."""
    if base < 1 or images <= base:
        raise ValueError(f"need 1 <= base < images, got base {base} and images {images}")
    exe = executable(venv)
    timeout = timeout_s if timeout_s is not None else 120 + images / 5
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    checks: list[dict[str, Any]] = []
    started = time.monotonic()
    for r in range(repeats):
        order = [("base", base), ("n", images)]
        if r % 2:
            order.reverse()  # alternate, so drift does not favour one of the pair
        got: dict[str, dict[str, Any]] = {}
        for kind, count in order:
            urls = [f"{origin_url}/{i}/{uuid.uuid4()}.jpg" for i in range(count)]
            run_dir = work_dir / f"r{r}-{kind}"
            reading = run_once(exe, urls, run_dir, threads=threads, timeout_s=timeout, env=env)
            if kind == "n":
                checks.append(check_thumbnails(Path(reading["out"])))
            if not keep:
                shutil.rmtree(reading["out"], ignore_errors=True)
            got[kind] = reading
            print(
                f"  img2dataset repeat {r} {count} image(s): {reading['successes']} "
                f"thumbnails, CPU {reading['cpu_s']:.2f} s, wall {reading['wall_s']:.1f} s",
                file=sys.stderr,
            )
        pairs.append((got["base"], got["n"]))
    wall_s = round(time.monotonic() - started, 1)
    return _img2dataset_result(
        pairs, checks, images=images, base=base, threads=threads, wall_s=wall_s
    )


def _img2dataset_result(
    pairs: Sequence[tuple[dict[str, Any], dict[str, Any]]],
    checks: Sequence[dict[str, Any]],
    *,
    images: int,
    base: int,
    threads: int,
    wall_s: float,
) -> dict[str, Any]:
    """``measure_img2dataset``'s result from its (base run, N run) readings and the N runs'
    thumbnails checked."""
    figures = per_image_figures(pairs)
    successes = [n["successes"] for _, n in pairs]
    return {
        "tool": "img2dataset",
        "version": VERSION,
        "settings": f"{SIZE} px long side (keep_ratio_largest, only if bigger), JPEG q{QUALITY}, "
        f"1 process, {threads} threads, no hash, EXIF on, files",
        **figures,
        "images": images,
        "base_images": base,
        "repeats": len(pairs),
        "successes_by_repeat": successes,
        "all_succeeded": all(s == images for s in successes)
        and all(b["successes"] == base for b, _ in pairs),
        "failures": sum(
            run["failed_to_download"] + run["failed_to_resize"] for pair in pairs for run in pair
        ),
        "thumbnails_checked": _checks_summed(checks),
        "wall_s": wall_s,
        "wall_s_n_runs": [n["wall_s"] for _, n in pairs],
        "command": " ".join(pairs[-1][1]["command"]),
        "runs": [{"base": b, "n": n} for b, n in pairs],
    }
