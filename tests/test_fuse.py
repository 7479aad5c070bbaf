"""``archscan fuse``: batch norms folded (and kept, with the reason), hand-written attention rewritten to
SDPA, real weights loaded, the check, the saved program, the CLI and the before/after bookkeeping.

Every numerical claim is checked against something computed here, not by archscan: the original model
run directly on the test's own inputs, ``torch.fx.experimental.optimization.fuse`` (an independent
conv-bn folder), a fresh Python process that loads the ``.pt2`` with plain torch, and the batch-norm
modules counted in the built model.
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

import archscan
from archscan import zoo
from archscan.load.targets import input_specs, to_target
from archscan.cli import main
from archscan.errors import ArchscanError, VerifyError
from archscan.transform import fuse
from archscan.transform.weights import randomize_batch_norms

import fusable  # tests/models, on sys.path through conftest

HERE = os.path.dirname(os.path.abspath(__file__))
FUSABLE = os.path.join(HERE, "models", "fusable.py")
_BN = nn.modules.batchnorm._BatchNorm
RTOL = 1e-5  # float32: |fused - original| <= RTOL * max|original|

# Batch norms per zoo model, counted from zoo/*.py (every one follows a bias-free conv2d that nothing
# else reads, so all fold):
#   resnet: stem 1 + 2 (BasicBlock) or 3 (Bottleneck) per block + 1 per projection shortcut
#     resnet18 1+8*2+3 = 20, resnet34 1+16*2+3 = 36, resnet50 1+16*3+4 = 53, resnet101 1+33*3+4 = 104
#   mobilenet_v1: stem 1 + 13 separable blocks * 2 = 27 (any width)
#   mobilenet_v2: stem 1 + first block (t=1) 2 + 16 blocks * 3 + last 1x1 conv 1 = 52 (any width)
#   shufflenet_v1: stem 1 + 16 units * 3 = 49 (any groups, any width)
#   shufflenet_v2: stem 1 + 3 stride-2 units * 5 + 13 stride-1 units * 3 + conv5 1 = 56 (any width)
# probes (g1-g4), vit and llama have none.
EXPECTED_BN = {
    "resnet18": 20, "resnet34": 36, "resnet50": 53, "resnet101": 104,
    "mobilenet_v1": 27, "mobilenet_v1_050": 27, "mobilenet_v2": 52, "mobilenet_v2_140": 52,
    **{n: 49 for n in ("shufflenet_v1_g1_x1_0", "shufflenet_v1_g2_x1_0", "shufflenet_v1_g3_x0_5", "shufflenet_v1_g3_x1_0",
                       "shufflenet_v1_g3_x1_5", "shufflenet_v1_g3_x2_0", "shufflenet_v1_g4_x1_0", "shufflenet_v1_g8_x1_0")},
    **{f"shufflenet_v2_{w}": 56 for w in ("x0_5", "x1_0", "x1_5", "x2_0")},
}
ZOO_INPUT = "1,3,32,32"


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("archscan: error:"), lines[0]
    return lines[0]


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def call_ops(program) -> list[str]:
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


def meta_model(name: str) -> nn.Module:
    with torch.device("meta"):
        return zoo.create_model(name)


# One model per structure the zoo has (basic and bottleneck residual blocks, MobileNet V1 and V2,
# ShuffleNet V1 with dense and grouped pointwise convs, ShuffleNet V2): the other widths and depths
# repeat the same blocks. These are fused in every run (each fuse exports the model twice: ResNet-101
# takes 20 s); ARCHSCAN_TEST_FULL_ZOO=1 fuses every model of the table (about 150 s more).
QUICK_ZOO = ("resnet18", "resnet50", "mobilenet_v1_050", "mobilenet_v2", "shufflenet_v1_g1_x1_0",
             "shufflenet_v1_g3_x0_5", "shufflenet_v2_x0_5")
FULL_ZOO = os.environ.get("ARCHSCAN_TEST_FULL_ZOO", "0") != "0"
_ZOO_CASES: dict = {}


def zoo_case(name: str, tmp_dir):
    """(model, fuse result): the zoo model with random batch-norm statistics drawn here, saved and
    fused with ``--weights``, so the test holds the original to compare with. Computed once."""
    if name not in _ZOO_CASES:
        torch.manual_seed(1)
        model = zoo.create_model(name).eval()
        assert randomize_batch_norms(model) == EXPECTED_BN[name]
        path = os.path.join(tmp_dir, f"{name}.pt")
        torch.save(model.state_dict(), path)
        _ZOO_CASES[name] = model, fuse(to_target(f"zoo:{name}"), input_specs(ZOO_INPUT), weights=path)
    return _ZOO_CASES[name]


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory):
    yield str(tmp_path_factory.mktemp("zoo-weights"))
    _ZOO_CASES.clear()  # the fused zoo is not kept for the rest of the suite


def fuse_with_weights(model: nn.Module, shapes, tmp_path, seed: int = 0, **kw):
    """Randomise ``model``'s batch-norm statistics, save its state_dict, fuse its class with those weights,
    and check the fused program against ``model`` itself on inputs drawn here."""
    torch.manual_seed(seed)
    model.eval()
    randomize_batch_norms(model)
    path = tmp_path / f"{type(model).__name__}.pt"
    torch.save(model.state_dict(), path)
    shapes = [shapes] if isinstance(shapes, str) else list(shapes)
    result = fuse(to_target(model), input_specs(shapes), weights=str(path), **kw)
    inputs = [torch.randn(*map(int, s.split(","))) for s in shapes]
    with torch.no_grad():
        ref, got = model(*inputs), result.program.module()(*inputs)
    for r, g in zip(*(o if isinstance(o, tuple) else (o,) for o in (ref, got))):
        assert g.shape == r.shape
        assert rel_err(g, r) < RTOL
    return result


# --------------------------------------------------------------------------- 1. the zoo's batch norms
def test_expected_table_matches_the_built_models():
    """The table is the zoo: every model's BatchNorm modules counted (models absent from it have none)."""
    names = zoo.list_models()
    assert set(EXPECTED_BN) <= set(names)
    counts = {n: sum(isinstance(m, _BN) for m in meta_model(n).modules()) for n in names}
    assert counts == {n: EXPECTED_BN.get(n, 0) for n in names}


@pytest.mark.parametrize("name", sorted(EXPECTED_BN) if FULL_ZOO else QUICK_ZOO)
def test_zoo_batch_norms_all_fold(name, zoo_dir):
    model, r = zoo_case(name, zoo_dir)
    n = EXPECTED_BN[name]
    assert r.check.passed and r.check.outputs == 1 and r.check.dtype == "float32"
    assert r.check.max_rel_err < RTOL
    assert r.check.max_abs_err > 0  # folding did change the arithmetic: the check compared something
    assert len(r.folded) == n and r.folded_by_kind == {"conv2d+bn": n}
    assert r.kept == () and r.attention == ()
    assert (r.before["batch_norms"], r.after["batch_norms"]) == (n, 0)
    assert r.before["kernels"] - r.after["kernels"] == n
    assert r.before["flops"] == r.after["flops"]
    assert r.after["mac_bytes"] < r.before["mac_bytes"]
    # each fold drops the norm's weight and bias (2C) and gives the bias-free conv a bias (C)
    norms = {path: m for path, m in model.named_modules() if isinstance(m, _BN)}
    assert r.before["params"] - r.after["params"] == sum(m.num_features for m in norms.values())
    # every norm folded, each into its own conv, named by module path
    assert sorted(f.norm for f in r.folded) == sorted(norms)
    assert len({f.layer for f in r.folded}) == n
    state = r.program.state_dict
    assert not any("running_mean" in k or "running_var" in k for k in state)
    # the folded program computes the original on an input drawn here
    torch.manual_seed(2)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert rel_err(r.program.module()(x), model(x)) < RTOL


def test_random_weights_randomise_batch_norm_statistics():
    """Without --weights the norms get random statistics: a fresh model's (mean 0, var 1, weight 1,
    bias 0) would fold to a bias of exactly 0 on a bias-free conv, and a scale of 1/sqrt(1+eps)."""
    r = fuse(to_target(fusable.ConvBN), input_specs("1,3,8,8"))
    assert r.weights is None and len(r.folded) == 2 and r.check.passed and r.check.max_abs_err > 0
    state = r.program.state_dict
    assert state["conv.bias"].abs().max() > 0.05  # conv had no bias: this one is all the norm's
    fresh = fusable.ConvBN()
    bias_change = (state["conv2.bias"] - fresh.conv2.bias).abs().max()
    assert bias_change > 0.05


# --------------------------------------------------------------------------- 2. oracle: torch.fx's fuse
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "shufflenet_v2_x0_5"])
def test_agrees_with_torch_fx_fuse(name, zoo_dir):
    from torch.fx.experimental.optimization import fuse as fx_fuse

    model, r = zoo_case(name, zoo_dir)  # the same randomised weights, loaded by archscan from a file
    oracle = fx_fuse(model)
    assert sum(isinstance(m, _BN) for m in oracle.modules()) == 0 == r.after["batch_norms"]
    assert sum(isinstance(m, _BN) for m in model.modules()) == len(r.folded) == EXPECTED_BN[name]
    torch.manual_seed(3)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        ref, ours, theirs = model(x), r.program.module()(x), oracle(x)
    assert rel_err(ours, theirs) < RTOL
    assert rel_err(ours, ref) < RTOL and rel_err(theirs, ref) < RTOL
    # the two folds agree weight by weight too: torch.fx keeps module names for the fused convs
    fx_state = oracle.state_dict()
    for f in r.folded[:5]:
        assert torch.allclose(r.program.state_dict[f"{f.layer}.weight"], fx_state[f"{f.layer}.weight"], rtol=1e-5, atol=1e-7)
        assert torch.allclose(r.program.state_dict[f"{f.layer}.bias"], fx_state[f"{f.layer}.bias"], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- 3-7. what folds, what stays
def test_timm_style_batch_norm_act_folds(tmp_path):
    r = fuse_with_weights(fusable.TimmStyle(), "1,3,8,8", tmp_path)
    assert [(f.kind, f.layer, f.norm, f.activation) for f in r.folded] == [
        ("conv2d+bn", "conv1", "bn1", "silu"), ("conv2d+bn", "conv2", "bn2", "relu")]
    assert r.kept == () and (r.before["batch_norms"], r.after["batch_norms"]) == (2, 0)
    assert r.check.passed and r.check.max_rel_err < RTOL


def test_functional_batch_norm_on_own_buffers_folds(tmp_path):
    r = fuse_with_weights(fusable.FunctionalBN(), "1,3,8,8", tmp_path)
    assert [(f.kind, f.layer) for f in r.folded] == [("conv2d+bn", "conv")]
    assert r.kept == () and r.after["batch_norms"] == 0
    ops = call_ops(r.program)
    assert not any("batch_norm" in op for op in ops) and ops.count("aten.conv2d.default") == 1
    # the conv had a bias: folding rewrote it in place (no parameter added); mean/var/gamma/beta gone
    assert r.before["params"] - r.after["params"] == 12
    assert set(r.program.state_dict) == {"conv.weight", "conv.bias"}


def test_conv_read_twice_keeps_its_norm(tmp_path):
    r = fuse_with_weights(fusable.TwoUsers(), "1,3,8,8", tmp_path)
    assert [f.norm for f in r.folded] == ["bn1", "bn3"]
    assert len(r.kept) == 1 and r.kept[0].norm == "bn2"
    assert "users" in r.kept[0].reason and "2" in r.kept[0].reason
    assert (r.before["batch_norms"], r.after["batch_norms"]) == (3, 1)


def test_linear_bn_on_2d_folds(tmp_path):
    r = fuse_with_weights(fusable.LinearBN(), "4,16", tmp_path)
    assert [(f.kind, f.layer, f.norm) for f in r.folded] == [("linear+bn", "fc", "bn")]
    assert r.kept == () and r.after["batch_norms"] == 0


def test_linear_bn_on_3d_is_kept(tmp_path):
    r = fuse_with_weights(fusable.LinearBN3d(), "2,8,16", tmp_path)
    assert r.folded == ()
    assert [k.norm for k in r.kept] == ["bn"] and "3-D" in r.kept[0].reason
    assert r.after["batch_norms"] == 1 and r.after == r.before
    assert r.check.max_abs_err == 0.0  # nothing changed: bit for bit


@pytest.mark.parametrize("model,shape,kind", [
    (fusable.ConvTransposeBN(groups=1), "1,8,4,4", "conv_transpose2d+bn"),
    (fusable.Conv1dBN(), "2,4,10", "conv1d+bn"),
    (fusable.Conv3dBN(), "1,2,4,4,4", "conv3d+bn"),
], ids=["conv_transpose2d", "conv1d", "conv3d"])
def test_other_convs_fold(model, shape, kind, tmp_path):
    r = fuse_with_weights(model, shape, tmp_path)
    assert r.folded_by_kind == {kind: 1} and r.kept == ()
    assert (r.before["batch_norms"], r.after["batch_norms"]) == (1, 0)
    assert r.before["kernels"] - r.after["kernels"] == 1


def test_one_norm_module_after_two_convs_folds_into_both(tmp_path):
    r = fuse_with_weights(fusable.SharedNorm(), "1,4,6,6", tmp_path)
    assert [(f.layer, f.norm) for f in r.folded] == [("conv1", "bn"), ("conv2", "bn")] and r.kept == ()
    assert set(r.program.state_dict) == {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"}
    assert r.before["params"] - r.after["params"] == 8 - 4  # the norm's 2x4 gone, conv2's new bias of 4


@pytest.mark.parametrize("dtype,rtol", [(torch.bfloat16, 5e-2), (torch.float64, 1e-9)])
def test_fold_in_other_dtypes_checks_with_their_tolerance(dtype, rtol):
    r = fuse(to_target(fusable.ConvBN), input_specs("1,3,8,8", dtype), dtype=dtype)
    assert r.check.dtype == str(dtype).removeprefix("torch.") and r.check.rtol == rtol
    assert r.check.passed and len(r.folded) == 2
    assert all(t.dtype == dtype for t in r.program.state_dict.values())
    if dtype == torch.float64:
        assert r.check.max_rel_err < 1e-13


def test_same_padding_conv_folds(tmp_path):
    r = fuse_with_weights(fusable.SamePaddingConvBN(), "1,3,8,8", tmp_path)
    assert r.folded_by_kind == {"conv2d+bn": 1} and r.kept == ()


def test_grouped_transposed_conv_keeps_its_norm(tmp_path):
    r = fuse_with_weights(fusable.ConvTransposeBN(groups=2), "1,8,4,4", tmp_path)
    assert r.folded == () and [k.norm for k in r.kept] == ["bn"]
    assert "grouped transposed" in r.kept[0].reason
    assert r.after["batch_norms"] == 1 and r.check.max_abs_err == 0.0


def test_tied_conv_weight_keeps_both_norms(tmp_path):
    r = fuse_with_weights(fusable.TiedConv(), "1,4,6,6", tmp_path)
    assert r.folded == ()
    assert [k.norm for k in r.kept] == ["bn_a", "bn_b"]
    assert all("shared" in k.reason for k in r.kept)
    assert r.after["batch_norms"] == 2 and r.check.max_abs_err == 0.0


# --------------------------------------------------------------------------- 8. attention
QKV = ["2,4,8,16"] * 3  # [B, H, L, D]: scale 1/sqrt(16)


def _attention(variant, tmp_path):
    return fuse_with_weights(fusable.HandAttention(variant), QKV, tmp_path)


@pytest.mark.parametrize("variant", fusable.HandAttention.REWRITTEN)
def test_hand_written_attention_becomes_sdpa(variant, tmp_path):
    r = _attention(variant, tmp_path)  # outputs checked against the module itself
    assert len(r.attention) == 1
    (rw,) = r.attention
    # the nodes of the chain: transpose, q@k^T, [q*c | s*c | s/d], [+ mask | masked_fill], softmax, [dropout], p@v
    assert rw.nodes_removed == {"mask": 6, "div_sqrt": 5, "masked_fill": 6, "no_mask": 5, "dropout": 7,
                                "prescaled": 5}[variant]
    assert rw.scale == pytest.approx(0.25)
    assert rw.masked == (variant in ("mask", "masked_fill", "dropout"))
    ops = call_ops(r.program)
    assert ops.count("aten.scaled_dot_product_attention.default") == 1
    assert r.check.passed and r.check.max_rel_err < RTOL
    assert r.before["flops"] == 16384  # q@k^T and p@v: 2 * (2*4*8*8*16)
    assert r.folded == ()


@pytest.mark.parametrize("variant", fusable.HandAttention.REWRITTEN)
def test_attention_rewrite_leaves_no_score_chain(variant, tmp_path):
    r = _attention(variant, tmp_path)
    ops = call_ops(r.program)
    assert not any(op.startswith(("aten.softmax", "aten.matmul", "aten.dropout")) for op in ops), ops
    assert r.after["flops"] <= r.before["flops"]
    assert r.after["kernels"] <= r.before["kernels"] and r.after["mac_bytes"] < r.before["mac_bytes"]


@pytest.mark.parametrize("variant", fusable.HandAttention.KEPT)
def test_attention_that_is_not_sdpa_stays(variant, tmp_path):
    r = _attention(variant, tmp_path)
    assert r.attention == ()
    ops = call_ops(r.program)
    assert "aten.scaled_dot_product_attention.default" not in ops
    assert "aten.softmax.int" in ops
    assert r.check.max_abs_err == 0.0 and r.after == r.before
    assert r.check.outputs == (2 if variant == "returns_weights" else 1)
    assert len(r.attention_left) == 1 and r.attention_left[0][1]  # left as written, and why


@pytest.mark.parametrize("variant", fusable.HandAttention.TEMPERATURE)
def test_a_learned_temperature_folds_into_q(variant, tmp_path):
    r = _attention(variant, tmp_path)  # outputs checked against the module itself
    (rw,) = r.attention
    assert rw.temperature and rw.scale == 1.0 and r.attention_left == ()
    assert "aten.scaled_dot_product_attention.default" in call_ops(r.program)
    assert r.check.passed and r.check.max_rel_err < RTOL


def test_no_attention_flag_leaves_attention(tmp_path):
    r = fuse_with_weights(fusable.HandAttention("mask"), QKV, tmp_path, attention=False)
    assert r.attention == () and "aten.softmax.int" in call_ops(r.program)


# --------------------------------------------------------------------------- 9. weights
@pytest.fixture
def conv_bn_weights(tmp_path):
    torch.manual_seed(3)
    model = fusable.ConvBN().eval()
    randomize_batch_norms(model)
    return model, model.state_dict()


def _check_loaded(model, path):
    r = fuse(to_target(fusable.ConvBN), input_specs("1,3,8,8"), weights=str(path))
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        ref = model(x)
        assert rel_err(r.program.module()(x), ref) < RTOL
        assert rel_err(fusable.ConvBN().eval()(x), ref) > 1e-2  # other weights would not pass
    assert r.weights == str(path) and len(r.folded) == 2
    return r


def test_weights_state_dict_loads(conv_bn_weights, tmp_path):
    model, sd = conv_bn_weights
    torch.save(sd, tmp_path / "sd.pt")
    _check_loaded(model, tmp_path / "sd.pt")


def test_weights_from_safetensors(conv_bn_weights, tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    model, sd = conv_bn_weights
    safetensors.save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "sd.safetensors"))
    _check_loaded(model, tmp_path / "sd.safetensors")


def test_weights_wrapped_and_prefixed_checkpoint_loads(conv_bn_weights, tmp_path):
    model, sd = conv_bn_weights
    torch.save({"state_dict": {f"module.{k}": v for k, v in sd.items()}, "epoch": 7}, tmp_path / "ckpt.pt")
    _check_loaded(model, tmp_path / "ckpt.pt")


def test_weights_with_pickled_objects_refused(conv_bn_weights, tmp_path, capsys):
    _, sd = conv_bn_weights
    path = tmp_path / "ckpt.pt"
    torch.save({"state_dict": sd, "args": argparse.Namespace(lr=0.1)}, path)  # a typical training checkpoint
    out = tmp_path / "out.pt2"
    code, _, err = run(capsys, "fuse", f"{FUSABLE}:ConvBN", "--input", "1,3,8,8", "-w", str(path), "-o", str(out))
    assert code == 2
    line = one_line_error(err)
    assert str(path) in line and "weights_only" in line
    assert not out.exists()


def test_weights_missing_key_refused(conv_bn_weights, tmp_path, capsys):
    _, sd = conv_bn_weights
    path = tmp_path / "partial.pt"
    torch.save({k: v for k, v in sd.items() if k != "bn.running_var"}, path)
    with pytest.raises(ArchscanError, match=r"missing 1 key\(s\): bn\.running_var") as info:
        fuse(to_target(fusable.ConvBN), input_specs("1,3,8,8"), weights=str(path))
    assert info.value.exit_code == 2
    code, _, err = run(capsys, "fuse", f"{FUSABLE}:ConvBN", "--input", "1,3,8,8", "-w", str(path),
                       "-o", str(tmp_path / "out.pt2"))
    assert code == 2 and "bn.running_var" in one_line_error(err)


# --------------------------------------------------------------------------- 10. the saved program
def test_saved_program_runs_in_a_fresh_process_without_archscan(tmp_path):
    path = tmp_path / "resnet18.pt2"
    r = fuse(to_target("zoo:resnet18"), input_specs(ZOO_INPUT), path=str(path))
    assert r.path == str(path) and path.is_file()
    torch.manual_seed(5)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected = r.program.module()(x)
    torch.save({"x": x, "expected": expected}, tmp_path / "io.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        program = torch.export.load({str(path)!r}).module()
        io = torch.load({str(tmp_path / 'io.pt')!r})
        with torch.no_grad():
            out = program(io["x"])
        err = (out - io["expected"]).abs().max().item() / io["expected"].abs().max().item()
        batch_norms = sum("batch_norm" in str(n.target) for n in program.graph.nodes)
        print(f"shape={{'x'.join(map(str, out.shape))}} rel_err={{err:.3g}} batch_norms={{batch_norms}} "
              f"archscan_imported={{'archscan' in sys.modules}}")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    fields = dict(kv.split("=") for kv in proc.stdout.split())
    assert fields["shape"] == "1x1000"
    assert fields["archscan_imported"] == "False" and fields["batch_norms"] == "0"
    assert float(fields["rel_err"]) < 1e-6


# --------------------------------------------------------------------------- 11. a failing check
def test_failing_check_raises_and_saves_nothing(tmp_path):
    path = tmp_path / "never.pt2"
    with pytest.raises(VerifyError) as info:
        fuse(to_target("zoo:resnet18"), input_specs(ZOO_INPUT), path=str(path), rtol=0, atol=0)
    err = info.value
    assert err.exit_code == 6 and not path.exists()
    r = err.result
    assert not r.check.passed and r.check.max_abs_err > 0 and (r.check.rtol, r.check.atol) == (0, 0)
    assert r.path is None and len(r.folded) == 20  # what was done is still told
    assert "nothing was saved" in str(err)


def test_failing_check_cli_exit_code(tmp_path, capsys):
    path = tmp_path / "never.pt2"
    code, out, err = run(capsys, "fuse", "zoo:resnet18", "--input", ZOO_INPUT, "-o", str(path), "--rtol", "0", "--atol", "0")
    assert code == 6 and not path.exists()
    assert "differs from the original" in one_line_error(err)
    assert "FAILED" in out and "nothing: the check failed" in out


# --------------------------------------------------------------------------- 11b. a badly conditioned model
class SqueezeExcite(nn.Module):
    def __init__(self, channels, reduced):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, reduced, 1), nn.Conv2d(reduced, channels, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.expand(nn.functional.silu(self.reduce(x.mean((2, 3), keepdim=True)))))


def conv_bn(cin, cout, k=1, stride=1, groups=1, act=True):
    """conv (with a bias, as some trained models have before their norm) -> BN [-> SiLU]."""
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups), nn.BatchNorm2d(cout),
                         *([nn.SiLU()] if act else []))


class MBConv(nn.Module):
    def __init__(self, cin, cout, expand, k, stride):
        super().__init__()
        mid = cin * expand
        self.expand = conv_bn(cin, mid) if expand > 1 else nn.Identity()
        self.dw = conv_bn(mid, mid, k, stride, groups=mid)
        self.se = SqueezeExcite(mid, max(1, cin // 4))
        self.project = conv_bn(mid, cout, act=False)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.residual else y


class EfficientNetLike(nn.Module):
    """EfficientNet-B1's blocks (Tan & Le, ICML 2019: MBConv with squeeze-excite, SiLU), few and narrow."""

    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 16, 3, 2)
        self.blocks = nn.Sequential(MBConv(16, 16, 1, 3, 1), MBConv(16, 24, 6, 3, 2), MBConv(24, 24, 6, 5, 1),
                                    MBConv(24, 40, 6, 3, 2))
        self.head = conv_bn(40, 128)
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc(self.head(self.blocks(self.stem(x))).mean((2, 3)))


def trained_looking(seed: int = 0) -> nn.Module:
    """EfficientNetLike with weights like some trained models': each norm's conv has small weights
    (x0.03) and a bias drifted far from zero (N(0, 30)), and the running statistics are measured on
    data (cumulative, train mode): every norm subtracts a mean the size of the bias from outputs that
    vary by a thousandth of it, and scales the rest up (large scales over small running variances).
    Float32 loses digits there; folded in float64, the bias and the mean cancel before rounding."""
    torch.manual_seed(seed)
    model = EfficientNetLike()
    with torch.no_grad():
        for block in model.modules():
            if isinstance(block, nn.Sequential) and isinstance(block[0], nn.Conv2d):
                block[0].weight.mul_(0.03)
                block[0].bias.normal_(0, 30)
                block[1].momentum = None
        model.train()(torch.randn(8, 3, 32, 32))
        for norm in model.modules():
            if isinstance(norm, nn.BatchNorm2d):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.normal_(0, 0.1)
    return model.eval()


def test_a_badly_conditioned_fold_is_judged_on_float64(tmp_path):
    model = trained_looking()
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert max((m.running_mean.abs() / m.running_var.sqrt()).max().item() for m in norms) > 1e3
    path = tmp_path / "effnet.pt2"
    r = archscan.fuse(model, ["1,3,32,32"], path=str(path))
    c = r.check
    assert len(r.folded) == len(norms) == 13 and r.kept == ()
    assert c.max_rel_err > c.rtol  # fused against the float32 original: beyond the tolerance, once refused
    assert c.passed and c.drifted == "original" and c.fused_rel_err64 < c.original_rel_err64 / 100
    # the oracle, on inputs drawn here: the saved program is nearer the float64 model than the float32 model is
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(x.double())
        original, fused = model(x), torch.export.load(str(path)).module()(x)
    assert rel_err(fused, exact) < rel_err(original, exact) / 100 and rel_err(original, exact) > 1e-4


def test_an_explicit_tolerance_bounds_the_difference_from_the_original():
    with pytest.raises(VerifyError) as info:
        archscan.fuse(trained_looking(), ["1,3,32,32"], rtol=1e-4)
    assert info.value.result.check.drifted is None  # the tolerance asked for: no float64 verdict


def test_a_fold_that_drifts_is_refused_and_named(monkeypatch):
    """A fold made wrong by one part in a thousand: farther from float64 than the original, refused."""
    from archscan.transform import fold

    def off(*args, **kwargs):
        w, b = torch.nn.utils.fusion.fuse_conv_bn_weights(*args, **kwargs)
        return w * 1.001, b

    monkeypatch.setattr(fold, "fuse_conv_bn_weights", off)
    with pytest.raises(VerifyError) as info:
        fuse(to_target(fusable.ConvBN), input_specs("1,3,8,8"))
    c = info.value.result.check
    assert not c.passed and c.drifted == "fused" and c.fused_rel_err64 > 1e-4 > c.original_rel_err64
    assert "farther from a float64 run of the original" in str(info.value)


def test_the_float64_verdict_on_tiny_outputs():
    """compare() with a float64 reference: |f - e| against max(atol + rtol * max|e|, |o - e|)."""
    from archscan.transform.verify import compare

    exact = (torch.tensor([1.0, -2.0], dtype=torch.float64),)
    original = (torch.tensor([1.0, -2.001]),)  # 1e-3 off: |o - e| = 1e-3, rtol * 2 = 2e-4
    closer = (torch.tensor([1.0, -2.0005]),)   # 5e-4 off: beyond the tolerance of the original, nearer float64
    farther = (torch.tensor([1.0, -1.998]),)   # 2e-3 off
    c = compare(original, closer, exact=exact)
    assert c.passed and c.drifted == "original"
    assert c.original_rel_err64 == pytest.approx(1e-3 / 2, rel=1e-3) and c.fused_rel_err64 == pytest.approx(5e-4 / 2, rel=1e-3)
    c = compare(original, farther, exact=exact)
    assert not c.passed and c.drifted == "fused"
    c = compare(original, farther)
    assert not c.passed and c.drifted is None and c.fused_rel_err64 is None


# --------------------------------------------------------------------------- 12. the command line
@pytest.fixture(scope="module")
def original_scan():
    return archscan.scan("zoo:resnet18", ZOO_INPUT)


def test_cli_fuse_text_json_and_scan_of_the_program(tmp_path, capsys, original_scan):
    path = tmp_path / "x.pt2"
    code, out, err = run(capsys, "fuse", "zoo:resnet18", "--input", ZOO_INPUT, "-o", str(path))
    assert code == 0, err
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "conv2d+bn 20" in lines["folded"] and "20 batch norm(s)" in lines["folded"]
    assert str(path) in lines["saved"] and "passed" in lines["check"]
    assert "68 -> 48" in lines["kernels"]
    assert path.is_file()

    path.unlink()
    code, out, err = run(capsys, "fuse", "zoo:resnet18", "--input", ZOO_INPUT, "-o", str(path), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["schema"] == "archscan.fuse/1" and data["folded_by_kind"] == {"conv2d+bn": 20}
    assert len(data["folded"]) == 20 and data["kept"] == [] and data["attention"] == []
    assert data["check"]["passed"] and data["path"] == str(path) and data["weights"] is None
    assert data["inputs"] == [{"shape": [1, 3, 32, 32], "dtype": "float32"}]
    assert data["before"]["batch_norms"] == 20 and data["after"]["batch_norms"] == 0
    assert path.is_file()

    code, out, err = run(capsys, str(path), "--json")
    assert code == 0, err
    scanned = json.loads(out)
    assert not [n for n in scanned["nodes"] if any("batch_norm" in op for op in n["aten_ops"])]
    assert sum(1 for n in scanned["nodes"] if n["category"] == "conv") == 20
    assert scanned["totals"]["flops"] == original_scan.totals.flops == data["after"]["flops"]
    assert scanned["totals"]["mac_bytes"] == data["after"]["mac_bytes"]
    assert scanned["totals"]["params"] == data["after"]["params"] == original_scan.totals.params - 4800


def test_scan_of_saved_program_has_no_train_mode_warning(tmp_path, capsys):
    path = tmp_path / "convbn.pt2"
    fuse(to_target(fusable.ConvBN), input_specs("1,3,8,8"), path=str(path))
    code, out, err = run(capsys, str(path), "--json")
    assert code == 0, err
    assert [f["rule"] for f in json.loads(out)["findings"] if f["rule"] == "no-grad"] == []


# --------------------------------------------------------------------------- 13. bookkeeping vs the estimate
def test_measured_saving_equals_the_recommendation_estimate(original_scan, zoo_dir):
    _, r = zoo_case("resnet18", zoo_dir)
    (rec,) = [x for x in original_scan.recommendations if x.kind == "fuse"]
    saving = rec.estimated_saving
    b, a = r.before, r.after
    assert b["kernels"] - a["kernels"] == saving["kernels"] == 20
    assert b["mac_bytes"] - a["mac_bytes"] == saving["mac_bytes"]
    assert b["params"] - a["params"] == saving["params"] == 4800  # 2C per norm dropped, C of bias added
    assert b["flops"] - a["flops"] == saving["flops"] == 0
    assert (b["params"], b["flops"], b["mac_bytes"]) == (
        original_scan.totals.params, original_scan.totals.flops, original_scan.totals.mac_bytes)
    assert len(rec.target) == 20
