"""Hostile segmentation inputs: a hospital's mask files, its heartbeat, and a job asked of
hospitals whose data cannot serve it.

* Mask files that do not fit (another class range, shape, channel count, fractional or
  non-finite values, a CSV reaching outside the folder) are refused before any turn, each
  problem naming its file, never quoting a pixel beyond the offending class.
* A heartbeat claiming impossible mask counts, or mixing a label count into a
  segmentation summary, is a 400 and changes nothing stored.
* A segmentation job over a hospital that reports no masks (and a classification job over
  one that reports only masks) is a 400 naming that hospital; nothing is created.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from PIL import Image

from hospital_agent.data import DataProblem, DataSource, check_data
from hospitals.models import Hospital
from tests.platform_apps.training.conftest import report
from training.models import Job

H, W = 8, 8


def _pairs(root: Path, n: int = 3) -> Path:
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for i in range(n):
        Image.fromarray(np.full((H, W), 40 * i + 10, dtype=np.uint8)).save(
            root / "images" / f"c{i}.png"
        )
        mask = np.zeros((H, W), dtype=np.uint8)
        mask[2:5, 2:5] = 1
        Image.fromarray(mask).save(root / "masks" / f"c{i}.png")
    return root


def _nifti(path: Path, array: np.ndarray) -> None:
    nib.save(nib.Nifti1Image(array.astype(np.float32), np.eye(4)), path)


def test_hostile_mask_files_are_refused_before_a_turn_each_named(tmp_path: Path) -> None:
    root = _pairs(tmp_path / "set", n=1)
    names = {
        "wide.nii.gz": np.full((H, W), 7.0),  # a class the job does not have
        "half.nii.gz": np.full((H, W), 0.5),  # not a class index at all
        "nan.nii.gz": np.full((H, W), np.nan),
        "neg.nii.gz": np.full((H, W), -3.0),
        "big.nii.gz": np.zeros((H * 4, W * 4)),  # not its image's shape
    }
    for name, array in names.items():
        image = np.full((H, W), 99, dtype=np.uint8)
        Image.fromarray(image).save(root / "images" / name.replace(".nii.gz", ".png"))
        _nifti(root / name, array)
    secret = tmp_path / "secret.png"  # a file outside the hospital's folder
    Image.fromarray(np.ones((H, W), dtype=np.uint8)).save(secret)
    rows = [f"images/{n.replace('.nii.gz', '.png')},{n}" for n in names]
    rows.append("images/c0.png,../secret.png")
    (root / "pairs.csv").write_text("image,mask\n" + "\n".join(rows) + "\n")
    source = DataSource(kind="folder", path=str(root), task="segmentation", masks_csv="pairs.csv")
    with pytest.raises(DataProblem) as excinfo:
        check_data(source, input_shape=(1, H, W), num_classes=2)
    found = {Path(p.file).name: p.reason for p in excinfo.value.problems if p.file}
    assert "class 7, outside the job's classes 0..1" in found["wide.nii.gz"]
    assert "not whole numbers" in found["half.nii.gz"]
    assert "NaN or infinite" in found["nan.nii.gz"]
    assert "negative class -3" in found["neg.nii.gz"]
    assert f"mask is [{H * 4}, {W * 4}]" in found["big.nii.gz"]
    assert "'../secret.png' must be a name inside the folder" in found["pairs.csv"]
    assert excinfo.value.total == 6
    # Only the offending class is told, never another value of a file.
    reasons = " ".join(p.reason for p in excinfo.value.problems)
    assert "0.5" not in reasons and "99" not in reasons


SEGMENTATION_SUMMARY = {
    "image_shape": [1, 32, 32],
    "split_sizes": {"train": 8, "val": 2},
    "task": "segmentation",
    "masks": 10,
    "mask_classes": {"0": 10, "1": 9},
}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"mask_classes": {"0": 10, "1": 11}}, "mask_classes"),  # in more masks than exist
        ({"mask_classes": {"tumour": 3}}, "mask_classes"),  # not a class index
        ({"label_counts": {"0": 5}}, "label_counts"),  # a label count in a mask summary
        ({"masks": None}, "masks"),
        ({"task": "detection"}, "task"),
    ],
)
def test_a_heartbeat_cannot_claim_impossible_masks(
    agent_client, hospital_a: Hospital, change: dict, field: str
) -> None:
    summary = {k: v for k, v in {**SEGMENTATION_SUMMARY, **change}.items() if v is not None}
    before = dict(hospital_a.dataset_summary)
    body = {"agent_status": "idle", "agent_version": "0.1.0", "dataset_summary": summary}
    response = agent_client(hospital_a).post("/api/agent/heartbeat/", body, format="json")
    assert response.status_code == 400, response.content
    assert field in str(response.json()["details"])
    hospital_a.refresh_from_db()
    assert hospital_a.dataset_summary == before


@pytest.mark.django_db
def test_a_segmentation_job_over_a_hospital_without_masks_is_refused_naming_it(
    client_for, consortium_admin, job_data, three_hospitals
) -> None:
    a, b, c = three_hospitals
    for hospital in (a, c):
        hospital.dataset_summary = SEGMENTATION_SUMMARY
        hospital.save(update_fields=["dataset_summary"])
    report(b, shape=[1, 32, 32])  # labels, no masks
    admin = client_for(consortium_admin)
    data = job_data(
        model="unet",
        task="segmentation",
        mode="ushaped",
        cuts=["model.skip.submodule.down", "model.skip"],
        num_classes=2,
    )
    response = admin.post("/api/jobs/", data, format="json")
    assert response.status_code == 400, response.content
    reasons = response.json()["details"]["participants"]
    assert len(reasons) == 1 and repr(b.slug) in reasons[0] and "no masks" in reasons[0]
    # And the other way round: masks are not labels.
    response = admin.post("/api/jobs/", job_data(num_classes=2), format="json")
    assert response.status_code == 400, response.content
    named = " ".join(response.json()["details"]["participants"])
    assert repr(a.slug) in named and repr(c.slug) in named and repr(b.slug) not in named
    assert not Job.objects.exists()
