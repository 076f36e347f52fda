"""``medsplit privacy``: the audit's table and JSON, and its errors on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from medsplit.cli import main

TINY = ["--samples", "60", "--input-shape", "1,16,16", "--train-steps", "4", "--steps", "5"]


def test_the_table_names_each_figure_and_what_it_means(capsys) -> None:
    assert main(["privacy", "small_cnn", "--cut", "conv1", *TINY]) == 0
    out = capsys.readouterr().out
    assert "vanilla mode, cut conv1 (activation 16x16x16 per image)" in out
    assert "48 training images, 12 validation images reconstructed" in out
    rows = {line.split("  ")[0]: line for line in out.splitlines() if "  " in line}
    assert {"inversion SSIM", "inversion PSNR", "distance correlation", "label leakage"} <= set(
        rows
    )
    assert "He et al." in rows["inversion SSIM"]
    assert "n/a" in rows["label leakage"] and "labels travel" in rows["label leakage"]


def test_json_of_a_ushaped_audit_has_the_attacks_and_the_picture(capsys, tmp_path) -> None:
    picture = tmp_path / "grid.png"
    args = ["privacy", "small_cnn", "--mode", "ushaped", "--json", "--picture", str(picture)]
    assert main([*args, *TINY]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mode"] == "ushaped" and report["cuts"] == ["pool1", "pool"]
    assert report["activation"] == [16, 8, 8] and report["labels"] == "hospital"
    assert set(report["label_leakage"]) == {
        "norm_auc",
        "norm_strength",
        "cosine_auc",
        "cosine_strength",
    }
    assert 0 <= report["ssim"] <= 1 and 0 <= report["distance_correlation"] <= 1
    assert report["picture"] == str(picture)
    with Image.open(picture) as image:
        # Eight validation images, each above its reconstruction, four times larger.
        assert (image.format, image.size) == ("PNG", (8 * 16 * 4, 2 * 16 * 4))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["small_cnn", "--cut", "no_such_layer"], "no_such_layer"),
        (["skip_net", "--cut", "block1"], "2 tensors cross cut 'block1'"),
        (["small_cnn", "--cut", "conv1", "--data", "{corrupt}"], "not a MedMNIST .npz archive"),
    ],
    ids=["unknown-cut", "two-tensors", "corrupt-npz"],
)
def test_bad_input_is_refused_with_a_clear_error(
    capsys, tmp_path: Path, extra: list[str], message: str
) -> None:
    corrupt = tmp_path / "broken.npz"
    corrupt.write_bytes(b"PK\x03\x04 not really a zip archive")
    extra = [str(corrupt) if a == "{corrupt}" else a for a in extra]
    assert main(["privacy", *extra, *TINY]) == 2
    err = capsys.readouterr().err
    assert err.startswith("medsplit privacy: error:") and message in err
