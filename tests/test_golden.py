"""Rendered output against golden files. Regenerate on purpose: ARCHSCAN_REGEN_GOLDEN=1 pytest tests/test_golden.py"""

import json
import os

import pytest

import archscan
from archscan.report import render_text

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def check(name: str, text: str) -> None:
    path = os.path.join(HERE, "golden", name)
    if os.environ.get("ARCHSCAN_REGEN_GOLDEN"):
        with open(path, "w") as fh:
            fh.write(text)
    with open(path) as fh:
        assert text == fh.read(), f"{name} changed; regenerate on purpose with ARCHSCAN_REGEN_GOLDEN=1"


@pytest.fixture
def net_report(monkeypatch):
    monkeypatch.chdir(ROOT)  # source lines are relative to the working directory
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # the report of a CPU-only machine, on any machine
    # and of an AVX-512 CPU on any CPU: oneDNN's scratch, in the memory line, differs with AVX2
    monkeypatch.setattr("archscan.memory.scratch.onednn_block", lambda: 16)
    return archscan.scan("tests/models/toy.py:Net", [(1, 3, 32, 32)], name="toy:Net")


def test_text_report(net_report):
    check("net.txt", render_text(net_report, depth=1) + "\n")


def test_node_table(net_report):
    check("net_nodes.txt", render_text(net_report, per_node=True, findings=False) + "\n")


def test_json_report(net_report):
    check("net.json", json.dumps(net_report.to_json(), indent=1, sort_keys=True) + "\n")
