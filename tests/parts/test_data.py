"""The data side on real files: JPEG folders made from real photos, real DataLoader workers,
a CIFAR-10 pickle folder, corrupt files, and the workers recommendation."""

from __future__ import annotations

import hashlib
import json
import pickle
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from conftest import ROOT, at, compose_config, gpu_config, run_cli
from torch.utils.data import DataLoader

from gpubench.analysis.workers import fewest_workers
from gpubench.config.errors import ConfigError
from gpubench.config.settings import resolve
from gpubench.parts.augment import MEAN, STD, DeviceAugment, DeviceDecode, cpu_fixed_size
from gpubench.parts.data import build_pipeline, collate_skipping, loader_settings, preload, refill
from gpubench.parts.datasets import (
    MAX_SUBSTITUTES,
    ImageFiles,
    read_cifar10,
    scan_imagefolder,
    source_size,
    substitute_order,
)
from gpubench.run.runner import measure_run

sys.path.insert(0, str(ROOT / "scripts"))
from make_imagefolder import make_imagefolder  # noqa: E402

SIZE = 16  # TINY's dataset.image_size
SRC = source_size(SIZE)


@contextmanager
def deadline(seconds: int):
    """Fail, instead of hanging the suite, if the block outlives `seconds`."""

    def expired(*_):
        raise TimeoutError(f"still running after {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("imagefolder")
    make_imagefolder(root, classes=3, per_class=6, size=24, quality=85, seed=1)
    return root


def corrupt_folder(root: Path, good: int = 3) -> tuple[Path, list[Path]]:
    """`good` real JPEGs plus a truncated JPEG and a text file named .jpg, in one class."""
    make_imagefolder(root, classes=1, per_class=good, size=24, seed=2)
    cls = next(root.iterdir())
    whole = (cls / "00000.jpg").read_bytes()
    bad = [cls / "truncated.jpg", cls / "not_an_image.jpg"]
    bad[0].write_bytes(whole[: len(whole) // 2])
    bad[1].write_text("these bytes are no image\n")
    return root, bad


def cfg_for(root: Path, *overrides: str):
    return compose_config("dataset=imagefolder", f"dataset.root={root}", *overrides)


# ------------------------------------------------------------------ the script


def test_make_imagefolder_is_deterministic_real_jpegs(tmp_path):
    a = make_imagefolder(tmp_path / "a", classes=2, per_class=3, size=20, quality=80, seed=7)
    make_imagefolder(tmp_path / "b", classes=2, per_class=3, size=20, quality=80, seed=7)
    make_imagefolder(tmp_path / "c", classes=2, per_class=3, size=20, quality=80, seed=8)

    def digest(root):
        return {p.relative_to(root): hashlib.md5(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*.jpg"))}

    assert a["images"] == 6 and len(digest(tmp_path / "a")) == 6
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    assert digest(tmp_path / "a") != digest(tmp_path / "c")
    from PIL import Image

    for p in (tmp_path / "a").rglob("*.jpg"):
        with Image.open(p) as im:
            assert im.format == "JPEG" and im.mode == "RGB" and min(im.size) == 20


# ------------------------------------------------------------------ runs on a folder


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_imagefolder_three_phases(folder, tmp_path, workers):
    # a child of this process that is not a loader worker (a server a notebook started,
    # torch.compile's compile workers) must not be counted as one
    import subprocess

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        with deadline(120):
            r = measure_run(cfg_for(folder, f"loader.num_workers={workers}"), tmp_path)
    finally:
        bystander.kill()
        bystander.wait()
    d = r.data
    assert d["status"] == "ok", d["error"]
    assert list(d["phases"]) == ["loader", "compute", "e2e"]
    for name, ph in d["phases"].items():
        # a loader window spans at least 3x the batches its workers hold in flight
        # (core.pipe.loader_window_steps): with workers, more than the 2 steps asked
        assert ph["images_per_sec"] > 0 and ph["images"] % 4 == 0
        assert ph["images"] == 8 if name != "loader" or workers == 0 else ph["images"] > 8
    assert d["skipped_samples"] == 0
    info = d["data_info"]
    assert info["files"] == 18 and info["classes"] == 3 and info["num_workers"] == workers
    tel = d["phases"]["loader"]["telemetry"]
    assert tel["workers_max"] == workers
    # the split is read where the window's readings cover 20 clock ticks (0.2 s) or more;
    # where read, the workers' share only with workers
    if tel["main_cpu_util_mean"] is not None:
        assert (tel["workers_cpu_util_mean"] is not None) == (workers > 0)
    else:
        assert tel["workers_cpu_util_mean"] is None and tel["process_cpu_util_mean"] is None
    if workers == 0:
        # the main process itself read the 8 files of the window's 2 batches
        smallest = sorted(p.stat().st_size for p in folder.rglob("*.jpg"))[:8]
        assert tel["read_bytes"] >= sum(smallest) and tel["read_mb_per_s"] > 0
    else:
        assert tel["workers_peak_rss_bytes"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_loader_only_mode(folder, tmp_path, workers):
    with deadline(120):
        r = measure_run(cfg_for(folder, "bench.phases=[loader]", f"loader.num_workers={workers}"),
                        tmp_path)
    assert r.status == "ok" and list(r.data["phases"]) == ["loader"]
    assert r.data["loader_images_per_sec"] > 0 and r.data["compute_images_per_sec"] is None
    assert r.data["flops_per_step"] is None  # no model was built


@pytest.mark.slow  # `python -m gpubench -m`, DataLoader workers
def test_loader_workers_sweep_cli(folder, tmp_path):
    """The documented multirun: one loader-only job per worker count, then the pick."""
    from conftest import TINY

    proc = run_cli("-m", *TINY, "dataset=imagefolder", f"dataset.root={folder}",
                   "bench.phases=[loader]", "loader.num_workers=0,2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in tmp_path.glob("outputs/multirun/*/*/*/results.json")]
    rows = [(d["config"]["loader"]["num_workers"], d["loader_images_per_sec"]) for d in results]
    assert sorted(w for w, _ in rows) == [0, 2] and all(ips > 0 for _, ips in rows)
    # the pick on the measured rows, against compute rates set from them: the fewest workers
    # whose loader clears compute by 5% ...
    compute = max(ips for _, ips in rows) / 1.2
    pick = fewest_workers(rows, compute_images_per_sec=compute)
    assert pick.unblocks and pick.num_workers == min(w for w, ips in rows if ips >= compute * 1.05)
    # ... and when none does, the start of the plateau, saying the data side stays the limit
    stuck = fewest_workers(rows, compute_images_per_sec=2 * max(ips for _, ips in rows))
    best = max(ips for _, ips in rows)
    assert not stuck.unblocks and "stays the bottleneck" in stuck.reason
    assert stuck.num_workers == min(w for w, ips in rows if ips >= 0.95 * best)


# ------------------------------------------------------------------ preload


@pytest.mark.slow
def test_preload_equals_lazy_loading(folder):
    samples, _ = scan_imagefolder(folder)
    ds = ImageFiles(samples, cpu_fixed_size(SRC), "fail")
    lazy = [ds[i] for i in range(len(ds))]
    with deadline(120):
        images, labels, secs, skipped = preload(ds, SRC, num_workers=2)
    assert skipped == 0 and secs > 0
    assert images.is_shared()  # workers read it in place, no per-worker copy
    assert images.dtype == torch.uint8 and images.shape == (18, 3, SRC, SRC)
    assert torch.equal(images, torch.stack([x for x, _ in lazy]))
    assert labels.tolist() == [y for _, y in lazy] == [label for _, label in samples]


@pytest.mark.slow
def test_preload_run_reports_time_and_ram(folder, tmp_path):
    r = measure_run(cfg_for(folder, "dataset.preload=true", "loader.num_workers=2",
                            "bench.phases=[loader,e2e]"), tmp_path)
    assert r.status == "ok", r.data["error"]
    info = r.data["data_info"]
    assert info["preload_bytes"] == 18 * 3 * SRC * SRC and info["preload_seconds"] > 0


def test_preload_larger_than_free_ram_is_refused(folder, tmp_path):
    free = psutil.virtual_memory().available
    # an image side at which 18 cached images need 1.1 x the free RAM (the cache may take 80%),
    # while two float32 batches of one image fit in half of it (check_resources' batch rule:
    # 0.37 of the free RAM); refused before decoding
    side = int((1.1 * free / (3 * 18)) ** 0.5 * 7 / 8) + 1
    with pytest.raises(ConfigError, match="dataset.preload") as e:
        measure_run(cfg_for(folder, "dataset.preload=true", f"dataset.image_size={side}",
                            "loader.batch_size=1"), tmp_path)
    assert "GiB" in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------ bad input


@pytest.mark.slow
def test_corrupt_files_are_skipped_and_counted(tmp_path):
    root, bad = corrupt_folder(tmp_path / "f", good=3)
    cfg = cfg_for(root, "loader.num_workers=2", "loader.drop_last=false", "loader.batch_size=2")
    pipe = build_pipeline(resolve(cfg))
    sizes = []
    try:
        with deadline(120):
            for batch in pipe.loader:  # exactly one epoch
                moved = pipe.to_device(batch)
                sizes.append(len(moved[1]))
    finally:
        pipe.shutdown()
    # every corrupt file is replaced by a good one: full batches (2, 2, then the last 1)
    assert sizes == [2, 2, 1] and pipe.skipped >= len(bad) == 2


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_file_fails_naming_it(tmp_path, workers):
    root, bad = corrupt_folder(tmp_path / "f", good=1)
    cfg = cfg_for(root, "dataset.on_corrupt=fail", f"loader.num_workers={workers}",
                  "loader.batch_size=3")  # every batch holds a corrupt file
    with deadline(120):
        r = measure_run(cfg, tmp_path / "out")
    err = r.data["error"]
    assert r.status == "failed" and r.objective == 0.0
    assert err.startswith("dataset.on_corrupt=fail: cannot decode ") and "\n" not in err
    assert any(str(p) in err for p in bad)


@pytest.mark.slow  # a process: that it ends, and in time, is the subject
def test_corrupt_file_fail_cli_exits_never_hangs(tmp_path):
    from conftest import run_process

    root, bad = corrupt_folder(tmp_path / "f", good=1)
    proc = run_process("model=tiny", "dataset=imagefolder", f"dataset.root={root}",
                       "dataset.on_corrupt=fail", "loader.num_workers=2", "loader.batch_size=3",
                       "dataset.image_size=16", "bench.device=cpu", "tracking=none",
                       cwd=tmp_path, timeout=180)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "status: failed" in proc.stdout
    (results,) = tmp_path.glob("outputs/runs/*/*/results.json")
    err = json.loads(results.read_text())["error"]
    assert any(str(p) in err for p in bad) and "\n" not in err


def test_folder_problems_name_dataset_root(tmp_path):
    (tmp_path / "empty").mkdir()
    flat = tmp_path / "flat"
    make_imagefolder(flat, classes=1, per_class=2, size=16)
    cls = next(flat.iterdir())
    for f in cls.iterdir():  # images, but not in class sub-folders
        f.rename(flat / f.name)
    cls.rmdir()
    hollow = tmp_path / "hollow"
    (hollow / "cat").mkdir(parents=True)
    (hollow / "dog").mkdir()
    (hollow / "dog" / "notes.txt").write_text("not an image")
    cases = {tmp_path / "missing": "an existing folder", tmp_path / "empty": "none found",
             flat: "none found", hollow: "all are empty"}
    for root, why in cases.items():
        with pytest.raises(ConfigError, match="dataset.root") as e:
            measure_run(cfg_for(root), tmp_path / "out")
        assert str(root) in str(e.value) and why in str(e.value)


def test_more_classes_than_the_model_has(folder, tmp_path):
    with pytest.raises(ConfigError, match="dataset.num_classes"):
        measure_run(cfg_for(folder, "dataset.num_classes=2"), tmp_path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_decode_on_device_needs_cuda(folder, tmp_path):
    with pytest.raises(ConfigError, match="dataset.decode_on"):
        measure_run(cfg_for(folder, "dataset.decode_on=device"), tmp_path)


@pytest.mark.parametrize("workers", [0, 1])
def test_bad_multiprocessing_context(workers):
    cfg = compose_config(f"loader.num_workers={workers}", "loader.multiprocessing_context=threads")
    with pytest.raises(ConfigError, match="loader.multiprocessing_context") as e:
        resolve(cfg)
    assert "spawn" in str(e.value) and "\n" not in str(e.value)


def test_worker_settings_survive_spawn_pickling():
    # spawn/forkserver workers unpickle worker_init_fn: a closure would fail there
    ld = resolve(compose_config("loader.num_workers=2", "loader.worker_threads=2",
                                "loader.multiprocessing_context=spawn")).loader
    kw = loader_settings(ld, "cpu")
    assert kw["multiprocessing_context"] == "spawn"
    init = pickle.loads(pickle.dumps(kw["worker_init_fn"]))
    before = torch.get_num_threads()
    try:
        init(0)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------ CIFAR-10 pickle format


def write_cifar(root: Path, per_batch: int = 4) -> tuple[np.ndarray, list[int]]:
    """A tiny cifar-10-batches-py/ in the real layout: five pickled training batches of
    channel-planar 3072-byte rows plus batches.meta."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows, labels = [], []
    for i in range(1, 6):
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        ys = [int(v) for v in rng.integers(0, 10, per_batch)]
        with open(folder / f"data_batch_{i}", "wb") as f:
            pickle.dump({"batch_label": f"training batch {i} of 5", "data": data,
                         "labels": ys, "filenames": [f"{i}_{j}.png" for j in range(per_batch)]}, f)
        rows.append(data)
        labels += ys
    with open(folder / "batches.meta", "wb") as f:
        names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                 "ship", "truck"]
        pickle.dump({"label_names": names, "num_cases_per_batch": per_batch, "num_vis": 3072}, f)
    return np.concatenate(rows), labels


def test_cifar10_reader(tmp_path):
    rows, labels = write_cifar(tmp_path)
    # torchvision's reader checks each file's md5 against the official archive: it refuses
    # any other file in the same format, which is why gpubench reads the format itself
    from torchvision.datasets import CIFAR10

    with pytest.raises(RuntimeError, match="not found or corrupted"):
        CIFAR10(str(tmp_path), train=True, download=False)
    images, ys, classes = read_cifar10(tmp_path)
    assert images.shape == (20, 3, 32, 32) and images.dtype == torch.uint8
    assert ys.tolist() == labels and classes[3] == "cat"
    # rows are channel-planar: 1024 red, then 1024 green, then 1024 blue, row-major
    assert images[5, 1, 2, 7] == rows[5, 1024 + 2 * 32 + 7]
    assert torch.equal(read_cifar10(tmp_path / "cifar-10-batches-py")[0], images)


def test_cifar10_run_and_missing_batch(tmp_path):
    write_cifar(tmp_path)
    r = measure_run(compose_config("dataset=cifar10", f"dataset.root={tmp_path}"), tmp_path / "o")
    assert r.status == "ok", r.data["error"]
    assert r.data["data_info"]["samples"] == 20
    (tmp_path / "cifar-10-batches-py" / "data_batch_4").unlink()
    with pytest.raises(ConfigError, match="dataset.root.*data_batch_4"):
        measure_run(compose_config("dataset=cifar10", f"dataset.root={tmp_path}"), tmp_path / "p")


# ------------------------------------------------------------------ device-side transforms


def test_augment_on_device_batch_shape_dtype(folder, tmp_path):
    cfg = cfg_for(folder, "dataset.augment_on=device", "loader.num_workers=0")
    pipe = build_pipeline(resolve(cfg))
    try:
        item = next(pipe.batches())
        assert item[0][0].dtype == torch.uint8 and item[0][0].shape == (4, 3, SRC, SRC)
        x, y = pipe.to_device(item)
    finally:
        pipe.shutdown()
    assert x.shape == (4, 3, SIZE, SIZE) and x.dtype == torch.float32 and torch.isfinite(x).all()
    assert y.dtype == torch.int64 and y.shape == (4,)
    r = measure_run(cfg, tmp_path)
    assert r.status == "ok" and r.data["data_info"]["augment_on"] == "device"


def test_device_augment_normalizes_and_crops():
    # a flat-colour image stays flat under any crop and flip: every output pixel is known
    colour = torch.tensor([200, 100, 50], dtype=torch.uint8)
    x = colour.view(1, 3, 1, 1).expand(6, 3, 40, 30).contiguous()
    out = DeviceAugment(12, "cpu", seed=0)(x)
    want = (colour.float() / 255 - torch.tensor(MEAN)) / torch.tensor(STD)
    assert out.shape == (6, 3, 12, 12) and out.dtype == torch.float32
    assert torch.allclose(out, want.view(1, 3, 1, 1).expand_as(out), atol=1e-4)
    boxes = DeviceAugment(12, "cpu", seed=0).boxes(1000, 40, 30)
    w, h = boxes[:, 3] - boxes[:, 1], boxes[:, 4] - boxes[:, 2]
    assert (boxes[:, 1] >= 0).all() and (boxes[:, 3] <= 30 + 1e-4).all()
    assert (boxes[:, 4] <= 40 + 1e-4).all() and (w * h <= 1200 + 1e-3).all()
    assert (w * h).min() < 0.2 * 1200 < (w * h).max()  # per-sample crops of varied area


def test_device_decode_logic_on_cpu(folder, tmp_path):
    """DeviceDecode runs wherever decode_jpeg does: on the CPU its batching, resizing and
    per-image fallback are checked without a GPU."""
    files = sorted(folder.rglob("*.jpg"))[:3]
    blobs = [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8) for p in files]
    broken = torch.frombuffer(bytearray(files[0].read_bytes()[:200]), dtype=torch.uint8)
    x, failed = DeviceDecode(SRC, "cpu")(blobs)
    assert x.shape == (3, 3, SRC, SRC) and x.dtype == torch.uint8 and failed == []
    x2, failed = DeviceDecode(SRC, "cpu")([blobs[0], broken, blobs[2]])
    assert failed == [1] and torch.equal(x2, x[[0, 2]])


DECODE_ON_DEVICE = gpu_config(
    "data.decode_on_device", "dataset=imagefolder", "dataset.root={tmp}", "bench.device=cuda",
    "dataset.decode_on=device", "loader.num_workers=2", "loader.batch_size=4", "bench.steps=4")


@pytest.mark.gpu
@pytest.mark.slow  # the DataLoader's worker processes
def test_decode_on_device_run(tmp_path):
    root, bad = corrupt_folder(tmp_path / "f", good=7)
    bad[1].unlink()  # keep one corrupt JPEG: truncated bytes reach nvJPEG
    cfg = compose_config(*at(DECODE_ON_DEVICE, root))
    r = measure_run(cfg, tmp_path / "out")
    assert r.status == "ok", r.data["error"]
    assert r.data["data_info"]["decode_on"] == "device"
    pipe = build_pipeline(resolve(cfg))  # bench.device=cuda
    try:
        x, y = pipe.to_device(next(pipe.batches()))
    finally:
        pipe.shutdown()
    assert x.is_cuda and x.shape[1:] == (3, SIZE, SIZE) and x.dtype == torch.float32
    assert len(y) == len(x)


# ------------------------------------------------------------------ the workers rule


def test_fewest_workers_rule():
    rows = [(0, 50.0), (1, 90.0), (2, 170.0), (4, 300.0), (8, 310.0)]
    pick = fewest_workers(rows, 160.0)
    assert (pick.num_workers, pick.unblocks) == (2, True) and "1: 90.0" in pick.reason
    # 170 is not 5% above 165: the next count up is the first that unblocks with margin
    assert fewest_workers(rows, 165.0).num_workers == 4
    # nothing out-runs compute: the start of the plateau (4 is within 5% of 8's 310)
    pick = fewest_workers(rows, 1000.0)
    assert (pick.num_workers, pick.unblocks) == (4, False) and "data side" in pick.reason
    # repeats pool by median; dict rows as results.json gives them; failed runs ignored
    dict_rows = [{"num_workers": 1, "loader_images_per_sec": v} for v in (100.0, 10.0, 120.0)]
    dict_rows.append({"num_workers": 0, "loader_images_per_sec": None})
    pick = fewest_workers(dict_rows, 90.0)
    assert (pick.num_workers, pick.loader_images_per_sec) == (1, 100.0)
    assert fewest_workers([], 10.0).num_workers is None
    assert fewest_workers([(3, 10.0)], None).reason.startswith("compute throughput not measured")


def test_collate_counts_skipped_samples():
    x = torch.zeros(3, 4, 4)
    (out, y), skipped = collate_skipping([(x, 1), None, (x + 1, 2)])
    assert out.shape == (2, 3, 4, 4) and y.tolist() == [1, 2] and skipped == 1
    assert collate_skipping([None, None]) == (None, 2)
    loader = DataLoader([(x, 0)] * 3, batch_size=2, collate_fn=collate_skipping)
    assert [s for _, s in loader] == [0, 0]


def test_in_memory_pools_cycle_through_one_long_epoch(compose_cfg):
    """A 32-image pool must not end an epoch (and drain the workers) every 8 batches."""
    from gpubench.parts.datasets import CYCLED_EPOCH, Cycled

    cfg = compose_cfg("dataset.num_samples=32", "loader.batch_size=4", "dataset.image_size=16")
    pipe = build_pipeline(resolve(cfg))
    ds = pipe.loader.dataset
    assert isinstance(ds, Cycled) and len(ds) == CYCLED_EPOCH
    assert pipe.info["samples"] == 32
    assert ds.pool.labels[5] == ds[32 * 7 + 5][1]


# ------------------------------------------------------------------ corrupt data, flat bytes


def all_corrupt_folder(root: Path, n: int = 40) -> Path:
    cls = root / "c0"
    cls.mkdir(parents=True)
    for i in range(n):
        (cls / f"{i:03d}.jpg").write_bytes(b"\xff\xd8\xff" + b"not really a jpeg" * (i + 1))
    return root


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("phases", ["[loader]", "[loader,compute,e2e]"])
def test_all_corrupt_folder_fails_never_hangs(tmp_path, workers, phases):
    root = all_corrupt_folder(tmp_path / "f")
    cfg = cfg_for(root, f"loader.num_workers={workers}", f"bench.phases={phases}")
    with deadline(120):
        r = measure_run(cfg, tmp_path / "out")
    err = r.data["error"]
    assert r.status == "failed" and r.objective == 0.0, r.data
    assert err.startswith("dataset.on_corrupt=skip: 32 files tried in a row do not decode")
    assert str(root / "c0") in err and "\n" not in err


def test_substitutes_are_distinct_and_bounded():
    for n in (1, 2, 5, 40, 1000):
        order = substitute_order(7 % n, n, MAX_SUBSTITUTES)
        assert len(order) == min(n, MAX_SUBSTITUTES) == len(set(order)) and order[0] == 7 % n
    # not the next file in folder order: clustered corrupt files are hopped over
    assert substitute_order(0, 1000, 3)[1] != 1


@pytest.mark.slow
def test_jpeg_bytes_collate_to_one_flat_tensor(folder):
    files = sorted(folder.rglob("*.jpg"))[:5]
    ds = ImageFiles([(str(p), 0) for p in files], None, "skip", raw=True)
    loader = DataLoader(ds, batch_size=5, num_workers=1, collate_fn=collate_skipping)
    with deadline(120):
        (jpegs, y), skipped = next(iter(loader))
    assert isinstance(jpegs.data, torch.Tensor) and jpegs.data.dtype == torch.uint8
    assert jpegs.data.dim() == 1 and jpegs.offsets.tolist()[0] == 0 and skipped == 0
    assert jpegs.data.numel() == sum(p.stat().st_size for p in files)
    for blob, p in zip(jpegs.blobs(), files, strict=True):
        assert blob.is_contiguous() and bytes(blob.numpy()) == p.read_bytes()
    assert jpegs.names == [str(p) for p in files] and len(jpegs) == 5


def test_refill_keeps_batch_shape_and_pairs():
    x = torch.tensor([[10.0], [30.0], [40.0]])  # decoded images of inputs 0, 2, 3
    y = torch.tensor([0, 1, 2, 3, 4])
    x2, y2 = refill(x, y, failed=[1, 4])
    assert x2.shape[0] == 5 and y2.tolist() == [0, 2, 3, 0, 2]
    assert x2[:, 0].tolist() == [10.0, 30.0, 40.0, 10.0, 30.0]


def test_distributed_sampler_epoch_advances(folder):
    cfg = cfg_for(folder, "loader.num_workers=0", "loader.batch_size=3")
    pipe = build_pipeline(resolve(cfg), shard=(0, 2))  # 18 images: 9 per rank, 3 batches
    it = pipe.batches()
    epochs = [[next(it)[0][1].tolist() for _ in range(3)] for _ in range(2)]
    assert pipe.loader.sampler.epoch == 1
    assert epochs[0] != epochs[1]  # a new shuffle each epoch, as set_epoch gives


def test_more_workers_than_cores_runs_without_torchs_warning(compose_cfg):
    """A sweep asks for more workers than cores on purpose and reports their cost: torch's
    warning about the count is filtered where gpubench builds its loaders, so a caller's own
    warning filters (reset here, as a catch_warnings block may) do not bring it back. No worker
    starts: the check is the DataLoader's own method."""
    import os
    import warnings

    from gpubench.config.settings import resolve
    from gpubench.parts.data import build_pipeline

    s = resolve(compose_cfg(f"loader.num_workers={(os.cpu_count() or 1) + 1}"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.resetwarnings()
        warnings.simplefilter("always")  # every warning recorded, none shown once only
        build_pipeline(s).loader.check_worker_number_rationality()
    assert not [w for w in seen if "worker processes" in str(w.message)]


def test_worker_errors_keep_their_one_line():
    """torch re-raises a worker's error in the main process built from the worker's whole
    traceback text (ExceptionWrapper.reraise): str() keeps the one line that names the sample,
    for a corrupt file and a broken sample contract alike."""
    from torch._utils import ExceptionWrapper

    from gpubench.parts.custom_data import SampleContractError, as_label
    from gpubench.parts.datasets import CorruptImage, corrupt

    def reraised(make):
        try:
            make()
        except Exception:
            wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
        with pytest.raises(Exception) as e:
            wrapped.reraise()
        assert "Original Traceback" in e.value.args[0]  # the text torch built
        return e.value

    def bad_file():
        raise corrupt("/d/c0/a.jpg", "truncated")

    e = reraised(bad_file)
    assert isinstance(e, CorruptImage)
    assert str(e) == "dataset.on_corrupt=fail: cannot decode /d/c0/a.jpg: truncated"
    e = reraised(lambda: as_label(12, 10, "Mine[3]"))
    assert isinstance(e, SampleContractError) and isinstance(e, ValueError)
    assert str(e) == ("dataset=custom sample contract: Mine[3]: label 12 is outside [0, 10) "
                      "(raise dataset.num_classes)")
    assert str(SampleContractError("no prefix here")) == "no prefix here"
