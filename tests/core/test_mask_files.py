"""Files that hold a password are rewritten masked, through gpubench's one atomic writer."""

from __future__ import annotations

from gpubench.core.files import mask_files


def test_mask_files_masks_in_place_and_skips_the_rest(tmp_path):
    leaky, clean = tmp_path / "overrides.yaml", tmp_path / "config.yaml"
    leaky.write_text("- tracking.uri=postgresql://bob:s3cret@db/x\n")
    clean.write_text("name: tiny\n")
    before = clean.stat().st_mtime_ns
    mask_files([leaky, clean, tmp_path / "missing.yaml"])
    assert leaky.read_text() == "- tracking.uri=postgresql://bob:***@db/x\n"
    assert clean.stat().st_mtime_ns == before  # nothing to mask: not rewritten
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "overrides.yaml"]
