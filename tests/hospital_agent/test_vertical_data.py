"""hospital_agent.data.vertical: a vertical party's records from real files in tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hospital_agent.config import load_config
from hospital_agent.data import (
    DataProblem,
    DataSource,
    VerticalRecords,
    identifier_of,
    load_source,
    load_vertical,
)
from medsplit.psi import identifiers_from_files


def grey(seed: int, h: int = 10, w: int = 12) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w), dtype=np.uint8)


def write_table(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def problem(source: DataSource, **kw: object) -> DataProblem:
    with pytest.raises(DataProblem) as excinfo:
        load_vertical(source, **kw)
    return excinfo.value


# -- tables ---------------------------------------------------------------------------


def test_a_table_with_labels(tmp_path: Path) -> None:
    path = write_table(
        tmp_path / "labs.csv", "id,age,y,ldl\nP3,61,1,2.5\nP1,47,0,3.25\n\nP2,55,1,-1\n"
    )
    records = load_vertical(DataSource(kind="table", path=str(path), label_column="y"))
    assert records.identifiers == ("P3", "P1", "P2")
    assert torch.equal(
        records.features, torch.tensor([[61, 2.5], [47, 3.25], [55, -1]], dtype=torch.float32)
    )
    assert records.features.dtype == torch.float32
    assert torch.equal(records.labels, torch.tensor([1, 0, 1]))
    assert records.labels.dtype == torch.int64
    summary = records.summary().to_json()
    assert summary == {
        "image_shape": [2],
        "label_counts": {"0": 1, "1": 2},
        "split_sizes": {"train": 3, "val": 0},
    }
    assert "P1" not in json.dumps(summary)


def test_a_passive_table_with_chosen_columns(tmp_path: Path) -> None:
    path = write_table(tmp_path / "t.csv", "pid,a,b,c\nx-1,1,2,3\nx-2,4,5,6\n")
    records = load_vertical(
        DataSource(kind="table", path=str(path), id_column="pid", feature_columns="c, a")
    )
    assert records.labels is None and not records.labelled
    assert torch.equal(records.features, torch.tensor([[3.0, 1.0], [6.0, 4.0]]))
    assert records.summary().label_counts == {}
    assert torch.equal(records.rows([1, 0]).features, torch.tensor([[6.0, 4.0], [3.0, 1.0]]))
    assert records.rows([1]).identifiers == ("x-2",)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("id,a\nP1,1\nP2,2\nP1,3\n", "row 4: identifier 'P1' repeats row 2"),
        ("id,a\nP1,1\nP 2,2\n", "row 3: identifier 'P 2' holds ' '"),
        ("id,a\nP1,1\n,2\n", "row 3: empty identifier"),
        ("id,a\nP1,1\nP2,abc\n", "row 3: column 'a': the feature is not a number"),
        ("id,a\nP1,\n", "row 2: column 'a': the feature is missing"),
        ("id,a\nP1,nan\n", "row 2: column 'a': the feature is not finite"),
        ("id,a,y\nP1,1,0\nP2,2,1.5\n", "row 3: column 'y': the label is not an integer"),
        ("id,a,y\nP1,1,-1\n", "row 2: column 'y': label -1 is outside the job's classes >= 0"),
        ("id,a\nP1,1,7\n", "row 2: 3 columns where the header has 2"),
        ("pid,a\nP1,1\n", "row 1: the identifier column 'id' is not in the header"),
        ("id,y\nP1,1\n", "row 1: the header names no feature column"),
        ("", "row 1: the file is empty"),
        ("id,a\n", "no records: the dataset is empty"),
    ],
)
def test_bad_tables_name_file_and_row(tmp_path: Path, text: str, expected: str) -> None:
    path = write_table(tmp_path / "bad.csv", text)
    label = "y" if "y" in text.partition("\n")[0].split(",") else None
    error = problem(DataSource(kind="table", path=str(path), label_column=label))
    assert error.file == str(path)
    assert expected in str(error)
    if "abc" in text:
        assert "abc" not in str(error)  # a cell's value never leaves in a message


def test_a_table_label_outside_the_job_classes(tmp_path: Path) -> None:
    path = write_table(tmp_path / "t.csv", "id,a,y\nP1,1,0\nP2,1,2\n")
    error = problem(DataSource(kind="table", path=str(path), label_column="y"), num_classes=2)
    assert "row 3: column 'y': label 2 is outside the job's classes 0..1" in str(error)


def test_every_problem_of_a_table_is_listed(tmp_path: Path) -> None:
    path = write_table(tmp_path / "t.csv", "id,a\nP1,x\nP2,\nP1,1\nP1,2\n")
    error = problem(DataSource(kind="table", path=str(path)))
    assert error.total == 3
    assert "row 2" in str(error) and "row 3" in str(error) and "row 5" in str(error)


def test_a_missing_table(tmp_path: Path) -> None:
    error = problem(DataSource(kind="table", path=str(tmp_path / "none.csv")))
    assert error.file == str(tmp_path / "none.csv") and error.reason == "no such file"


def test_a_table_is_not_a_horizontal_source(tmp_path: Path) -> None:
    path = write_table(tmp_path / "t.csv", "id,a\nP1,1\n")
    with pytest.raises(DataProblem, match="only vertical jobs read it"):
        load_source(DataSource(kind="table", path=str(path)))


def test_a_synthetic_source_has_no_identifiers() -> None:
    with pytest.raises(DataProblem, match="has no identifiers"):
        load_vertical(DataSource(kind="synthetic", samples=4))


# -- medmnist with an identifiers CSV ------------------------------------------------


def write_npz(path: Path, n: int = 5) -> Path:
    images = np.stack([grey(i, 28, 28) for i in range(n)])
    labels = np.arange(n, dtype=np.uint8).reshape(n, 1) % 2
    np.savez(
        path,
        train_images=images,
        train_labels=labels,
        val_images=images[:2],
        val_labels=labels[:2],
        test_images=images[:2],
        test_labels=labels[:2],
    )
    return path


def test_medmnist_with_identifiers(tmp_path: Path) -> None:
    npz = write_npz(tmp_path / "tiny.npz")
    (tmp_path / "ids.csv").write_text("id\n" + "".join(f"H{i}\n" for i in range(5)))
    source = DataSource(kind="medmnist", path=str(npz), identifiers_csv="ids.csv")
    records = load_vertical(source)
    assert records.identifiers == tuple(f"H{i}" for i in range(5))
    plain = load_source(DataSource(kind="medmnist", path=str(npz)))
    assert torch.equal(records.features, plain.images)
    assert torch.equal(records.labels, plain.labels)
    assert records.summary().image_shape == [1, 28, 28]


def test_medmnist_identifier_problems(tmp_path: Path) -> None:
    npz = write_npz(tmp_path / "tiny.npz")
    ids = tmp_path / "ids.csv"
    source = DataSource(kind="medmnist", path=str(npz), identifiers_csv=str(ids))
    ids.write_text("id\nH0\nH1\nH2\n")
    error = problem(source)
    assert error.file == str(ids)
    assert "3 identifiers for the 5 images of split 'train'" in str(error)
    ids.write_text("id\nH0\nH1\nH2\nH1\nH4\n")
    assert "row 5: identifier 'H1' repeats row 3" in str(problem(source))
    ids.write_text("patient\nH0\n")
    assert "row 1: the header must be the one column id" in str(problem(source))
    no_csv = DataSource(kind="medmnist", path=str(npz))
    assert "give data.identifiers_csv" in str(problem(no_csv))
    missing = DataSource(kind="medmnist", path=str(npz), identifiers_csv="other.csv")
    assert problem(missing).file == str(tmp_path / "other.csv")


# -- folders --------------------------------------------------------------------------


def test_a_labelled_folder(tmp_path: Path) -> None:
    for i, name in enumerate(["P2.png", "P1.png", "P3.png"]):
        Image.fromarray(grey(i)).save(tmp_path / name)
    (tmp_path / "labels.csv").write_text("file,label\nP1.png,1\nP3.png,0\n")
    source = DataSource(kind="folder", path=str(tmp_path))
    records = load_vertical(source)
    assert records.identifiers == ("P1", "P3")
    plain = load_source(source)
    assert torch.equal(records.features, plain.images)
    assert torch.equal(records.labels, torch.tensor([1, 0]))


def test_an_unlabelled_folder_takes_every_image(tmp_path: Path) -> None:
    for i, name in enumerate(["b.png", "a.png", "c.png"]):
        Image.fromarray(grey(i)).save(tmp_path / name)
    (tmp_path / "notes.txt").write_text("not an image")
    records = load_vertical(DataSource(kind="folder", path=str(tmp_path)))
    assert (
        records.identifiers == ("a", "b", "c") == identifiers_from_files(tmp_path, pattern="*.png")
    )
    assert records.labels is None
    assert records.features.shape == (3, 1, 10, 12)
    assert float(records.features.min()) == 0.0 and float(records.features.max()) == 1.0
    # Each image scaled on its own, as the folder source does.
    labelled = tmp_path / "labels.csv"
    labelled.write_text("file,label\na.png,0\nb.png,0\nc.png,0\n")
    assert torch.equal(
        load_vertical(DataSource(kind="folder", path=str(tmp_path))).features, records.features
    )


def test_folder_identifier_problems(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    Image.fromarray(grey(0)).save(tmp_path / "P1.png")
    Image.fromarray(grey(1)).save(tmp_path / "sub" / "P1.png")
    (tmp_path / "labels.csv").write_text("file,label\nP1.png,0\nsub/P1.png,1\n")
    error = problem(DataSource(kind="folder", path=str(tmp_path)))
    assert error.file == str(tmp_path / "labels.csv")
    assert "labels.csv row 3: identifier 'P1' repeats labels.csv row 2" in str(error)
    assert identifier_of("sub/P0012.nii.gz") == "P0012"


def test_an_explicit_labels_csv_must_exist(tmp_path: Path) -> None:
    Image.fromarray(grey(0)).save(tmp_path / "P1.png")
    error = problem(DataSource(kind="folder", path=str(tmp_path), labels_csv="mine.csv"))
    assert error.file == str(tmp_path / "mine.csv")


def test_records_refuse_rows_that_disagree() -> None:
    with pytest.raises(ValueError, match="2 feature rows for 3 identifiers"):
        VerticalRecords(("a", "b", "c"), torch.zeros(2, 1))


# -- configuration --------------------------------------------------------------------


def test_the_vertical_keys_reach_the_source(tmp_path: Path) -> None:
    file = tmp_path / "agent.toml"
    file.write_text(
        'coordinator_url = "http://x"\nwork_dir = "/tmp/w"\n[data]\nkind = "table"\n'
        'path = "t.csv"\nid_column = "pid"\nfeature_columns = "a,b"\n'
    )
    config = load_config(
        file=file, flags={"data_label_column": "y"}, env={"MEDSPLIT_AGENT_DATA_SPLIT": "val"}
    )
    assert config.data == DataSource(
        kind="table",
        path="t.csv",
        split="val",
        id_column="pid",
        feature_columns="a,b",
        label_column="y",
    )
