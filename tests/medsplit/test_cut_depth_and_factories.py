"""How deep the cut table looks by default, ``depth``, and ``MODULE:FACTORY`` models on the
command line and behind an allow-list."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from monai.networks.nets import UNet
from torch import fx, nn

from medsplit.cli import main
from medsplit.cutting import cut_table
from medsplit.cutting.candidates import MAX_DEPTH, choose
from medsplit.errors import ConfigError, CutError, UnknownModelError
from medsplit.models import build_any_model
from medsplit.models.factory import build_factory_model, parse_model_args

UNET_ARGS = {
    "spatial_dims": 2,
    "in_channels": 1,
    "out_channels": 2,
    "channels": [4, 8, 16],
    "strides": [2, 2],
}


def tiny_unet(**kwargs: object) -> nn.Module:
    """A factory for the command line tests (``tests.medsplit....:tiny_unet``)."""
    return UNet(**{**UNET_ARGS, **kwargs})


def tiny_classifier(channels: int = 4) -> nn.Module:
    """A classifier factory, for ``verify`` (its loss takes class labels), with dropout:
    split and unsplit runs draw from one random stream."""
    return nn.Sequential(
        nn.Conv2d(1, channels, 3),
        nn.BatchNorm2d(channels),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(channels, 2),
    )


def _unet() -> nn.Module:
    torch.manual_seed(0)
    return tiny_unet()


# --- depth -----------------------------------------------------------------------------------


def test_default_unet_table_lists_encoder_bottom_and_decoder_cuts() -> None:
    rows = cut_table(_unet(), torch.randn(2, 1, 16, 16))
    counts = {r.name: len(r.crossing) for r in rows}
    assert counts["model.0"] == 1
    assert counts["model.1.submodule.0"] == 2  # encoder: the outer skip crosses
    assert counts["model.1.submodule.1.submodule"] == 3  # the bottom: both skips cross
    assert counts["model.1.submodule.1"] == 2  # decoder
    assert rows.note is None


def test_depth_two_gives_the_old_table_and_depth_widens_it() -> None:
    model, x = _unet(), torch.randn(2, 1, 16, 16)
    assert [r.name for r in cut_table(model, x, depth=2)] == ["model.0", "model.1"]
    deep = cut_table(model, x, depth=MAX_DEPTH)
    assert {"model.0.conv", "model.1.submodule.2.conv"} <= {r.name for r in deep}


@pytest.mark.parametrize("depth", [0, MAX_DEPTH + 1, True, 2.5])
def test_depth_out_of_range_is_refused(depth: object) -> None:
    with pytest.raises(CutError, match="depth must be an integer"):
        cut_table(_unet(), torch.randn(2, 1, 16, 16), depth=depth)  # type: ignore[arg-type]


def test_a_default_table_stops_at_its_limit_with_a_note() -> None:
    chosen = choose(fx.symbolic_trace(_unet()), depth=None, limit=3)
    assert len(chosen.names) <= 3
    assert chosen.note is not None and "stops at" in chosen.note


def test_cuts_depth_flag_narrows_the_table(capsys) -> None:
    name = f"{__name__}:tiny_unet"
    assert main(["cuts", name, "--input-shape", "1,16,16", "--depth", "2", "--json"]) == 0
    assert [row["name"] for row in json.loads(capsys.readouterr().out)] == ["model.0", "model.1"]


# --- MODULE:FACTORY --------------------------------------------------------------------------


def test_cuts_takes_a_factory_and_its_arguments(capsys) -> None:
    args = json.dumps({"channels": [2, 4, 8]})
    rc = main(["cuts", f"{__name__}:tiny_unet", "--model-args", args, "--input-shape", "1,16,16"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "model.1.submodule.1.submodule" in out


def test_verify_takes_a_factory_and_is_exact_with_dropout(capsys) -> None:
    rc = main(
        [
            "verify",
            f"{__name__}:tiny_classifier",
            "--model-args",
            '{"channels": 3}',
            "--input-shape",
            "1,16,16",
            "--cut",
            "1",
            "--steps",
            "2",
            "--batch-size",
            "4",
            "--json",
        ]
    )
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["exact"] is True


def test_a_factory_without_an_input_shape_is_refused(capsys) -> None:
    assert main(["cuts", f"{__name__}:tiny_unet"]) == 2
    assert "--input-shape" in capsys.readouterr().err


def test_a_module_not_allowed_is_refused_before_it_is_imported(tmp_path, monkeypatch) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "untrusted_models.py").write_text(
        f"open({str(marker)!r}, 'w').close()\ndef net():\n    return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UnknownModelError, match="'untrusted_models' is not allowed"):
        build_factory_model("untrusted_models:net", {}, allowed_modules=["monai"])
    assert not marker.exists() and "untrusted_models" not in sys.modules


def test_a_listed_package_allows_its_submodules() -> None:
    model = build_factory_model(
        "monai.networks.nets:UNet", UNET_ARGS, allowed_modules=["monai"], seed=0
    )
    again = build_any_model("monai.networks.nets:UNet", model_args=UNET_ARGS, seed=0)
    pairs = zip(model.parameters(), again.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


@pytest.mark.parametrize(
    ("text", "match"),
    [("[1, 2]", "JSON object"), ("{nope", "not JSON"), ("{}" + " " * 5000, "at most")],
)
def test_model_args_must_be_a_small_json_object(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_model_args(text)


def test_a_registry_model_takes_no_model_arguments() -> None:
    with pytest.raises(ConfigError, match="takes no model arguments"):
        build_any_model("small_cnn", model_args={"channels": 3})


class _InputEverywhere(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)) + x  # the raw input reaches the end: no cut is valid


def test_an_empty_default_table_says_why() -> None:
    rows = cut_table(_InputEverywhere(), torch.randn(2, 4))
    assert rows == []
    assert rows.note is not None and "raw data would leave" in rows.note
