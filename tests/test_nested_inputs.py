"""Inputs that are not flat tensors: a list of images (torchvision's detection models), a dict of
conditions (SDXL's ``added_cond_kwargs``), a dataclass, nested — from Python and from the
command line (``--input images[0]=3,224,224``, ``--input added_cond_kwargs.time_ids=2,6``). The
FLOP oracle is the multiply-adds by hand; an error never prints a tensor's values."""

import dataclasses

import pytest
import torch
import torch.nn as nn

import archscan
from archscan.cli import main
from nested import Conditioned, Images

MODELS = "tests/models/nested.py"


def images_macs(*sizes) -> int:
    return sum(4 * 3 * 9 * (h - 2) * (w - 2) for h, w in sizes)


@dataclasses.dataclass
class Batch:
    pixels: torch.Tensor
    mask: torch.Tensor | None = None


class FromBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, batch: Batch):
        return self.proj(batch.pixels) * batch.mask


@pytest.mark.parametrize("method", ["auto", "eager"])
def test_a_list_of_images(method):
    report = archscan.scan(Images(), [[(3, 16, 16), torch.randn(3, 20, 24)]], capture_method=method, recommend=False)
    assert report.totals.flops == images_macs((16, 16), (20, 24))
    assert [(i["path"], i["arg"]) for i in report.to_json()["inputs"]] == [("[0]", 0), ("[1]", 0)]


@pytest.mark.parametrize("method", ["auto", "fx", "eager", "export"])
def test_a_dict_of_conditions_by_name(method):
    inputs = {"x": (2, 8), "added_cond_kwargs": {"text_embeds": (2, 8), "time_ids": (2, 6)}}
    report = archscan.scan(Conditioned(), inputs, capture_method=method, recommend=False)
    assert report.totals.flops == 2 * 8 * 8 + 2 * 6 * 8
    assert [i["name"] for i in report.to_json()["inputs"]] == ["x", "added_cond_kwargs.text_embeds",
                                                             "added_cond_kwargs.time_ids"]


def test_a_dataclass_input():
    report = archscan.scan(FromBatch(), [Batch(torch.randn(2, 8), torch.ones(2, 8))], recommend=False)
    assert report.totals.flops == 2 * 8 * 8
    assert [i["path"] for i in report.to_json()["inputs"]] == [".pixels", ".mask"]


def test_nested_inputs_on_the_command_line(capsys):
    assert main([f"{MODELS}:Images", "--input", "images[0]=3,16,16", "--input", "images[1]=3,20,24", "--json"]) == 0
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["totals"]["flops"] == images_macs((16, 16), (20, 24))
    assert main([f"{MODELS}:Conditioned", "--input", "2,8", "--input", "added_cond_kwargs.text_embeds=2,8",
                 "--input", "added_cond_kwargs.time_ids=2,6"]) == 0
    out = capsys.readouterr().out
    assert "added_cond_kwargs.time_ids=2×6 float32" in out and "(224)" in out  # 2*8*8 + 2*6*8 multiply-adds


@pytest.mark.parametrize("args, needle", [
    (["--input", "images[x]=3,16,16"], "is not an argument name"),
    (["--input", "images.0=3,16,16"], "is not an argument name"),
    (["--input", "imagez[0]=3,16,16"], "has no argument 'imagez'"),
    (["--input", "images[0]=3,16,16", "--input", "images=3,16,16"], "given twice"),
])
def test_bad_nested_inputs_are_one_line(capsys, args, needle):
    code = main([f"{MODELS}:Images", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) <= 2 and needle in err[0], err  # the error, and its hint


@pytest.mark.parametrize("bad, needle", [
    ([[torch.randn(64, 64), 3.5]], "from 3.5"),
    ([{"a": {}}], "empty dict"),
    ([[torch.randn(64, 64), object()]], "from an object"),
    ([[]], "empty list"),
])
def test_an_input_error_never_prints_tensor_values(bad, needle):
    with pytest.raises(archscan.ArchscanError) as err:
        archscan.scan(Images(), bad, recommend=False)
    message = str(err.value)
    assert needle in message and "tensor(" not in message and len(message) < 300, message
