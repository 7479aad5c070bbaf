"""torch's structured control flow (``torch.cond``, ``torch.while_loop``, ``map``) in a scanned
model, and the memory of a model captured by a real run.

``torch.cond`` chooses its branch by a tensor's value: on fake tensors (and in the direct run,
whose activations are zeros) the capture cannot know it, so the model runs for real on seeded
inputs, as any model that reads values does; the branch taken is counted and the note says which.
Oracles: the branch's multiply-adds by hand, and the CPU allocator (``tests/memory_oracle.py``)
for the real run's memory."""

import pytest
import torch
import torch.nn as nn

import archscan
from archscan.cli import main
from memory_oracle import forward_peak


class Cond(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):
        return torch.cond(x.sum() > self.threshold, lambda x: self.a(x), lambda x: self.c(self.b(x)), (x,))

    threshold = 0.0


class While(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        i = torch.zeros((), dtype=torch.int64)
        return torch.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, self.lin(x)), (i, x))[1]


class Mapped(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        from torch._higher_order_ops.map import map as map_

        return map_(lambda row: self.lin(row), x)


@pytest.mark.parametrize("threshold, branch, flops", [(-1e9, "true", 2 * 8 * 8), (1e9, "false", 2 * (8 * 16 + 16 * 8))])
def test_cond_counts_the_branch_the_values_take(threshold, branch, flops):
    model = Cond()
    model.threshold = threshold
    report = archscan.scan(model, [(2, 8)], recommend=False)
    assert report.capture == "eager" and report.totals.flops == flops
    assert f"torch.cond took its {branch} branch" in report.capture_notes[-1]
    assert any("needs tensor values" in n for n in report.capture_notes)  # not a silent guess


def test_while_loop_counts_every_iteration():
    report = archscan.scan(While(), [(2, 8)], recommend=False)
    assert report.totals.flops == 3 * 2 * 8 * 8
    assert "torch.while_loop ran 3 iteration(s)" in report.capture_notes[-1]


def test_map_counts_the_body_on_every_slice():
    report = archscan.scan(Mapped(), [(5, 8)], recommend=False)
    assert report.totals.flops == 5 * 8 * 8 and report.capture == "eager"


def test_other_higher_order_ops_are_one_line(capsys, tmp_path):
    path = tmp_path / "scanned.py"
    path.write_text("import torch, torch.nn as nn\n"
                    "from torch._higher_order_ops.scan import scan\n\n\n"
                    "class Scan(nn.Module):\n"
                    "    def forward(self, x):\n"
                    "        return scan(lambda c, x: (c + x, c * x), x[0], x)[1]\n")
    code = main([f"{path}:Scan", "--input", "4,8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "higher-order op scan" in err[0] and "Traceback" not in err[0]


class Branchy(nn.Module):
    """Python control flow on a value: only a real run can take it."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x):
        h = self.up(x)
        if h.abs().mean() > 0:
            h = torch.relu(h)
        return self.down(h)


def test_a_model_captured_by_a_real_run_has_its_memory():
    """The real run carries the memory tracker: the inference peak of the model's own forward,
    against the CPU allocator on the same seeded inputs."""
    report = archscan.scan(Branchy(), [(512, 64)], recommend=False)
    assert report.capture == "eager" and any("for real" in n for n in report.capture_notes)
    memory = report.memory
    assert memory is not None and memory["basis"] == "eager"
    torch.manual_seed(0)
    want = forward_peak(Branchy().eval(), [torch.randn(512, 64)])
    assert abs(memory["peak_bytes"] - want) <= 0.01 * want, f"{memory['peak_bytes']:,} vs {want:,}"

