"""The peak-FLOPs table behind MFU: the most specific device name wins; unknown means no MFU."""

from __future__ import annotations

import pytest

from gpubench.telemetry.env import (
    PEAK_TFLOPS,
    device_peaks,
    facts,
    mfu_peak,
    peak_flops,
)


@pytest.mark.parametrize(
    "name,math,tflops",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H200", "tf32", 494.7),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5),
        ("NVIDIA L40S", "fp16", 362.05),
        ("NVIDIA L40", "fp16", 181.05),
        ("NVIDIA L4", "bf16", 121.0),
        ("Tesla T4", "fp16", 65.0),
        # form factors with their own clocks: never the SXM row
        ("NVIDIA H200 NVL", "bf16", 835.5),
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA H100 NVL", "bf16", 835.5),  # 1,671 sparse on the data sheet
        ("NVIDIA GH200 480GB", "bf16", 989.4),
        ("Tesla V100-PCIE-16GB", "fp16", 112.0),
        ("Tesla V100-PCIE-32GB", "fp32", 14.0),
        ("Tesla V100-SXM2-16GB", "fp16", 125.0),
        ("Tesla V100S-PCIE-32GB", "fp16", 130.0),
        ("NVIDIA B200", "bf16", 2250.0),
        ("NVIDIA B200", "fp32", 75.0),  # HGX B200's per-GPU column; GB200's GPU runs 80
        ("NVIDIA GB200", "bf16", 2500.0),
        ("NVIDIA A10G", "fp32", 31.2),
        ("NVIDIA L40S", "tf32", 183.0),
    ],
)
def test_known_devices(name, math, tflops):
    assert peak_flops(name, math) == pytest.approx(tflops * 1e12)


def test_unknown_device_or_dtype_gives_none():
    assert peak_flops("Some Future GPU", "bf16") is None
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None  # Volta has no bf16 units


def test_no_row_is_shadowed_by_an_earlier_one():
    """Every row is reachable: a name built from its own pattern is not claimed by a row above."""
    names = {
        r"\bGB200\b": "NVIDIA GB200", r"\bB200\b": "NVIDIA B200", r"\bGH200\b": "NVIDIA GH200",
        r"\bH200 NVL\b": "NVIDIA H200 NVL", r"\bH200\b": "NVIDIA H200",
        r"\bH100 PCIe\b": "NVIDIA H100 PCIe", r"\bH100 NVL\b": "NVIDIA H100 NVL",
        r"\bH100\b": "NVIDIA H100 80GB HBM3", r"\bA100\b": "NVIDIA A100-SXM4-40GB",
        r"\bL40S\b": "NVIDIA L40S", r"\bL40\b": "NVIDIA L40", r"\bL4\b": "NVIDIA L4",
        r"\bA10G\b": "NVIDIA A10G", r"\bA10\b": "NVIDIA A10",
        r"\bRTX 4090\b": "NVIDIA GeForce RTX 4090", r"\bRTX 3090\b": "NVIDIA GeForce RTX 3090",
        r"\bV100S\b": "Tesla V100S-PCIE-32GB",
        r"\bV100-PCIE\b|\bV100 PCIe\b": "Tesla V100-PCIE-16GB",
        r"\bV100-SXM2\b|\bV100 SXM2\b": "Tesla V100-SXM2-32GB", r"\bT4\b": "Tesla T4",
    }
    assert set(names) == {p for p, _ in PEAK_TFLOPS}
    for pattern, table in PEAK_TFLOPS:
        assert peak_flops(names[pattern], "fp32") == pytest.approx(table["fp32"] * 1e12), pattern


def test_unlisted_v100_form_factor_gets_no_mfu():
    # SXM3 (DGX-2) runs other clocks: no figure rather than the SXM2 one
    assert peak_flops("Tesla V100-SXM3-32GB", "fp16") is None


# What torch.cuda.get_device_name and get_device_properties(i).multi_processor_count report
# on MIG instances: the parent's name with the profile, and the slice's own SMs
@pytest.mark.parametrize("name, sms, whole", [
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", 14, 108),
    ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 42, 108),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 16, 132),
    ("NVIDIA H100 80GB HBM3 MIG 7g.80gb", 132, 132),
])
def test_a_mig_slice_gets_its_share_of_the_peak(name, sms, whole):
    full = peak_flops(name.split(" MIG")[0], "bf16")
    assert peak_flops(name, "bf16", sms) == pytest.approx(full * sms / whole)
    by_math = {"bf16": 9.0, "fp32": 1.0}  # every math scales alike, so the mixed peak too
    assert mfu_peak(name, by_math, sms)[0] == pytest.approx(
        mfu_peak(name.split(" MIG")[0], by_math)[0] * sms / whole)


def test_a_mig_slice_without_its_count_gets_no_peak():
    name = "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    assert peak_flops(name, "bf16") is None  # never the whole A100's 312
    pk, why = mfu_peak(name, {"bf16": 1e12})
    assert pk is None and "MIG" in why
    # the whole GPU without a count: its row, as before (records from older runs)
    assert peak_flops("NVIDIA A100-SXM4-40GB", "bf16") == pytest.approx(312e12)


def test_the_count_decides_against_the_row():
    # a cut-down part under a known name (RTX 4090 D: 114 of the 4090's 128 SMs, same clocks)
    assert peak_flops("NVIDIA GeForce RTX 4090 D", "fp16", 114) == pytest.approx(165.2e12 * 114 / 128)
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16", 132) == pytest.approx(989.4e12)
    # more SMs than the row's whole GPU: the row is not this device
    peaks, why = device_peaks("NVIDIA H100 PCIe", 132)
    assert peaks is None and "114" in why
    assert mfu_peak("Some Future GPU", {"bf16": 1.0}) == (None, "no peak-FLOPs row for 'Some Future GPU'")
    pk, why = mfu_peak("Tesla T4", {"bf16": 1.0}, 40)
    assert pk is None and "bf16" in why


def test_every_row_names_its_whole_gpus_multiprocessors():
    for pattern, row in PEAK_TFLOPS:
        assert isinstance(row["sms"], int) and 40 <= row["sms"] <= 148, pattern


def test_mixed_peak_weights_each_kind_by_its_time():
    # A100: tf32 156, fp32 19.5 TFLOP/s. 90% of FLOPs in tf32 convs, 10% in fp32 matmuls
    pk = mfu_peak("NVIDIA A100-SXM4-80GB", {"tf32": 9e12, "fp32": 1e12})[0]
    assert pk == pytest.approx(10e12 / (9e12 / 156e12 + 1e12 / 19.5e12))
    assert 19.5e12 < pk < 156e12
    assert mfu_peak("NVIDIA A100", {"tf32": 1.0})[0] == pytest.approx(156e12)
    assert mfu_peak("Tesla T4", {"bf16": 1.0})[0] is None  # no bf16 row on Turing
    assert mfu_peak("NVIDIA A100", {})[0] is None


def test_cpu_facts():
    f = facts("cpu")
    assert f["device"] == "cpu" and f["cpu_count"] >= 1 and f["torch"]
    assert f["device_memory_bytes"] > 0 and f["driver"] is None
    assert "multiprocessors" not in f  # a CUDA device's own count only


def test_a_cpu_run_names_no_cuda_or_cudnn_it_did_not_use():
    """A CUDA wheel reports its build's CUDA/cuDNN even without a GPU: a CPU run's facts must
    not carry them as if the device had them."""
    f = facts("cpu")
    assert f["cuda"] is None and f["cudnn"] is None


def test_the_cpu_is_named_by_its_model(tmp_path):
    """Two CPUs of one architecture are two devices: the model name, not 'x86_64'."""
    from gpubench.telemetry.env import cpu_model

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                    "model name\t: AMD EPYC 7B13  64-Core Processor\nflags\t: fpu\n")
    assert cpu_model(str(info)) == "AMD EPYC 7B13 64-Core Processor"
    info.write_text("processor\t: 0\n")
    assert cpu_model(str(info)) is None
    assert cpu_model(str(tmp_path / "absent")) is None


def test_the_commit_is_read_from_git_files_without_starting_git(tmp_path):
    """HEAD naming a ref in its file, in packed-refs, a detached HEAD, a worktree's gitdir and
    commondir; no checkout: None (env.facts runs on every run: no `git` process per run)."""
    from gpubench.telemetry.env import git_commit

    sha, other = "a" * 40, "b" * 40
    repo = tmp_path / "repo"
    (repo / ".git" / "refs" / "heads").mkdir(parents=True)
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (repo / "sub" / "dir").mkdir(parents=True)
    assert git_commit(str(repo / "sub" / "dir")) is None  # a ref with no commit yet
    (repo / ".git" / "packed-refs").write_text(f"# pack-refs\n{other} refs/heads/x\n"
                                               f"{sha} refs/heads/main\n")
    assert git_commit(str(repo / "sub" / "dir")) == sha  # from a folder below the checkout
    (repo / ".git" / "refs" / "heads" / "main").write_text(other + "\n")
    assert git_commit(str(repo)) == other  # the loose ref wins over packed-refs
    (repo / ".git" / "HEAD").write_text(sha + "\n")
    assert git_commit(str(repo)) == sha  # detached
    wt = tmp_path / "wt"
    (repo / ".git" / "worktrees" / "wt").mkdir(parents=True)
    (repo / ".git" / "worktrees" / "wt" / "HEAD").write_text("ref: refs/heads/main\n")
    (repo / ".git" / "worktrees" / "wt" / "commondir").write_text("../..\n")
    wt.mkdir()
    (wt / ".git").write_text(f"gitdir: {repo / '.git' / 'worktrees' / 'wt'}\n")
    assert git_commit(str(wt)) == other
    assert git_commit(str(tmp_path)) is None  # no checkout above it


def test_facts_start_no_process(tmp_path, monkeypatch):
    """What a run records of its machine is read, never asked of another process (`uname -p`
    behind platform.platform(), `git rev-parse`): a quick test starting one fails (conftest)."""
    import platform

    from gpubench.telemetry.env import facts, platform_text

    monkeypatch.chdir(tmp_path)
    f = facts("cpu")
    assert f["platform"] == platform_text() and f["platform"].startswith(platform.system())
    assert f["device_name"]
