"""bench.peer without img2dataset: a fake ``img2dataset`` script (a main process and a
"pool" child that burn known CPU and write img2dataset's files output) for the
measurement and the start-up subtraction; the venv's reuse logic without pip."""

from __future__ import annotations

import io
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from bench import peer

FAKE = textwrap.dedent(
    """\
    #!{python}
    import json, os, subprocess, sys, threading, time

    def burn(seconds):
        t0 = time.process_time()
        while time.process_time() - t0 < seconds:
            pass

    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    if "--child" in args:  # the "pool": per-image work and the files output
        urls = open(args["--url_list"]).read().split()
        out = args["--output_folder"]
        os.makedirs(out + "/00000")
        template = open(os.environ["FAKE_TEMPLATE"], "rb").read()
        fail = int(os.environ.get("FAKE_FAIL", "0"))
        burn(float(os.environ["FAKE_STARTUP_S"]) / 2)
        for i, _ in enumerate(urls[fail:]):
            burn(float(os.environ["FAKE_PER_IMAGE_S"]))
            with open(f"{{out}}/00000/{{i:09d}}.jpg", "wb") as f:
                f.write(template)
            with open(f"{{out}}/00000/{{i:09d}}.json", "w") as f:
                json.dump({{"original_width": 64, "original_height": 48}}, f)
        stats = {{"count": len(urls), "successes": len(urls) - fail,
                  "failed_to_download": fail, "failed_to_resize": 0}}
        with open(out + "/00000_stats.json", "w") as f:
            json.dump(stats, f)
        sys.exit(0)
    if os.environ.get("FAKE_HANG"):  # a run that never ends: only its deadline stops it
        threading.Event().wait()
    burn(float(os.environ["FAKE_STARTUP_S"]) / 2)
    subprocess.run([sys.executable, __file__, "--child", "1", *sys.argv[1:]], check=True)
    """
)


def _jpeg(size: tuple[int, int], quality: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (90, 140, 200)).save(out, "JPEG", quality=quality)
    return out.getvalue()


@pytest.fixture
def fake_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    exe = peer.executable(venv)
    exe.parent.mkdir(parents=True)
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(0o755)
    return venv


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    template = tmp_path / "thumb.jpg"
    template.write_bytes(_jpeg((64, 48), peer.QUALITY))
    return {
        "PATH": os.environ["PATH"],
        "FAKE_TEMPLATE": str(template),
        "FAKE_STARTUP_S": "0.12",
        "FAKE_PER_IMAGE_S": "0.008",
        **extra,
    }


def _measure(venv: Path, tmp_path: Path, images: int, repeats: int, **env: str) -> dict[str, Any]:
    return peer.measure_img2dataset(
        venv,
        "http://127.0.0.1:9",
        images=images,
        repeats=repeats,
        work_dir=tmp_path / "work",
        env=_env(tmp_path, **env),
    )


@pytest.mark.timing(
    "asserts CPU seconds per image and start-up CPU seconds of a child process tree"
)
def test_measure_subtracts_the_start_up(fake_venv: Path, tmp_path: Path) -> None:
    result = _measure(fake_venv, tmp_path, images=40, repeats=2)
    # Per image: the child's burn exactly, plus writing two small files (and the noise of
    # two interpreters' start-up over 39 images).
    assert 0.0072 <= result["cpu_s_per_image"] <= 0.0105, result["cpu_s_per_image_by_repeat"]
    assert len(result["cpu_s_per_image_by_repeat"]) == 2
    # Start-up: the burns (0.12 s) plus two interpreters' start.
    assert 0.09 <= result["startup_cpu_s"] <= 1.0, result["startup_cpu_s_by_repeat"]
    assert result["all_succeeded"] and result["failures"] == 0
    assert result["successes_by_repeat"] == [40, 40]
    checked = result["thumbnails_checked"]
    assert checked["thumbnails"] == 80
    assert checked["wrong_size"] == checked["not_jpeg"] == checked["luma_table_not_quality"] == 0
    assert "--resize_mode keep_ratio_largest" in result["command"]
    assert "--image_size 640" in result["command"] and "--encode_quality 85" in result["command"]
    # Both runs of each pair were made, in alternating order, with the crawl's URL shape.
    urls = (tmp_path / "work" / "r1-n" / "urls.txt").read_text().split()
    assert len(urls) == 40 and urls[7].startswith("http://127.0.0.1:9/7/")
    assert urls[7].endswith(".jpg")
    assert not (tmp_path / "work" / "r0-n" / "out").exists()  # outputs are not kept


def test_failures_are_counted_not_hidden(fake_venv: Path, tmp_path: Path) -> None:
    result = _measure(
        fake_venv,
        tmp_path,
        images=12,
        repeats=1,
        FAKE_FAIL="1",
        FAKE_STARTUP_S="0.02",
        FAKE_PER_IMAGE_S="0.001",
    )
    assert not result["all_succeeded"]
    assert result["successes_by_repeat"] == [11]
    assert result["failures"] == 2  # one in each run of the pair


def test_a_run_over_its_deadline_is_killed(fake_venv: Path, tmp_path: Path) -> None:
    with pytest.raises(peer.PeerError, match="ran over"):
        peer.run_once(
            peer.executable(fake_venv),
            ["http://127.0.0.1:9/0/a.jpg"],
            tmp_path / "run",
            timeout_s=0.3,
            env=_env(tmp_path, FAKE_HANG="1"),
        )


def test_per_image_arithmetic() -> None:
    pairs = [
        ({"cpu_s": 3.5, "successes": 1}, {"cpu_s": 3.5 + 0.012 * 999, "successes": 1000}),
        ({"cpu_s": 3.9, "successes": 1}, {"cpu_s": 3.4 + 0.013 * 999, "successes": 1000}),
        ({"cpu_s": 3.4, "successes": 1}, {"cpu_s": 3.3 + 0.011 * 999, "successes": 1000}),
    ]
    got = peer.per_image_figures(pairs)
    assert got["cpu_s_per_image_by_repeat"] == pytest.approx([0.012, 0.0125, 0.0109], abs=1e-4)
    assert got["cpu_s_per_image"] == pytest.approx(0.012)
    assert got["startup_cpu_s"] == pytest.approx(3.488, abs=1e-3)
    with pytest.raises(peer.PeerError):
        peer.per_image_figures([({"cpu_s": 1, "successes": 1}, {"cpu_s": 2, "successes": 1})])


def test_thumbnail_check_sees_size_and_quality(tmp_path: Path) -> None:
    shard = tmp_path / "00000"
    shard.mkdir()
    cases = [((640, 360), 85, (2048, 1152)), ((500, 300), 85, (500, 300)),
             ((640, 360), 75, (1280, 720)), ((600, 338), 85, (1280, 720))]  # fmt: skip
    for i, (size, quality, original) in enumerate(cases):
        (shard / f"{i}.jpg").write_bytes(_jpeg(size, quality))
        meta = {"original_width": original[0], "original_height": original[1]}
        (shard / f"{i}.json").write_text(json.dumps(meta))
    got = peer.check_thumbnails(tmp_path)
    assert got["thumbnails"] == 4
    assert got["luma_table_not_quality"] == 1
    assert got["wrong_size"] == 1 and got["wrong_size_examples"][0][0] == "3.jpg"


def _marker(venv: Path) -> None:
    (venv / peer.MARKER).write_text(json.dumps(peer._wanted_marker(peer.VERSION, peer.PINS)))


def test_a_complete_venv_is_reused(fake_venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (fake_venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    _marker(fake_venv)

    def no_install(*_: object) -> None:
        raise AssertionError("installed again")

    monkeypatch.setattr(peer, "_install", no_install)
    got = peer.ensure_img2dataset(fake_venv)
    assert got["installed_now"] is False and got["img2dataset"] == peer.VERSION


def test_a_stale_venv_is_made_again(
    fake_venv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (fake_venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (fake_venv / peer.MARKER).write_text(json.dumps({"img2dataset": "1.45.0"}))
    (fake_venv / "old-file").write_text("x")
    calls = []

    def install(venv: Path, version: str, pins: Path, log: Path | None) -> None:
        calls.append((venv, version, pins))
        peer.executable(venv).parent.mkdir(parents=True)
        peer.executable(venv).write_text("")

    monkeypatch.setattr(peer, "_install", install)
    got = peer.ensure_img2dataset(fake_venv)
    assert calls == [(fake_venv, peer.VERSION, peer.PINS)]
    assert got["installed_now"] is True
    assert not (fake_venv / "old-file").exists()
    assert peer._read_marker(fake_venv) == peer._wanted_marker(peer.VERSION, peer.PINS)
    # A folder that is not a venv is never deleted.
    other = tmp_path / "not-a-venv"
    other.mkdir()
    (other / "precious").write_text("x")
    with pytest.raises(peer.PeerError, match="not a virtual environment"):
        peer.ensure_img2dataset(other)
    assert (other / "precious").exists()


def test_the_pins_name_the_version() -> None:
    pins = peer.PINS.read_text().splitlines()
    assert f"img2dataset=={peer.VERSION}" in pins
    assert any(line.startswith("opencv-python-headless==") for line in pins)
