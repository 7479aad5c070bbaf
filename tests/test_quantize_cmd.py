"""``archscan quantize``: the drift it reports against the drift computed here, the saved program
under plain ``torch.export.load``, the bytes as stored, ``--keep``, ``--budget`` and bad input.

Every number is checked against something computed here from the two models' outputs, not read
back from archscan's own bookkeeping: the original is rebuilt from the ``--weights`` file the test
wrote, and the inputs are drawn as archscan's transforms draw them (RNG seeded 0, the constructor
run, then ``torch.randn`` of each input's shape); SQNR is ``10·log10(Σ ref² / Σ (ref − q)²)``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import archscan
from archscan.cli import main

pytest.importorskip("torchao")

from torchao.quantization import quantize_  # noqa: E402

from archscan.quant import parse_scheme  # noqa: E402
from archscan.quant.schemes import INT4_ON_CPU, config  # noqa: E402

HERE = __file__


class MLP(nn.Module):
    """A classifier: 64 features -> 128 -> 128 -> 128 -> 10 logits. The first and last layers stay."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = nn.Linear(64, 128), nn.Linear(128, 128), nn.Linear(128, 128), nn.Linear(128, 10)

    def forward(self, x):
        return self.d(torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x)))))))


class Block(nn.Module):
    """Transformer-ish: a pre-norm attention block (qkv, SDPA, out) and an MLP, then a head."""

    def __init__(self, d: int = 64):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.head = nn.Linear(d, 32)

    def forward(self, x):                       # x: [B, T, 64]
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, 4, d // 4).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(a)
        x = x + self.down(F.gelu(self.up(self.norm2(x))))
        return self.head(x)                      # [B, T, 32]


class Wide(nn.Module):
    """Five layers of different widths: a budget quantizes some of the three in the middle."""

    def __init__(self):
        super().__init__()
        self.inp, self.m1, self.m2, self.m3, self.outp = (nn.Linear(32, 96), nn.Linear(96, 256), nn.Linear(256, 96),
                                                          nn.Linear(96, 96), nn.Linear(96, 8))
        with torch.no_grad():
            self.m1.weight[:, :8] *= 20     # a few large columns: m1 quantizes worst

    def forward(self, x):
        for m in (self.inp, self.m1, self.m2, self.m3):
            x = torch.relu(m(x))
        return self.outp(x)


class Convs(nn.Module):
    """No nn.Linear: nothing a torchao config takes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return self.conv(x).mean((2, 3))


INPUTS = {"MLP": (256, 64), "Block": (2, 16, 64), "Wide": (64, 32), "Convs": (1, 3, 16, 16)}


# --- helpers ---------------------------------------------------------------------------------------

def sqnr(ref: torch.Tensor, q: torch.Tensor) -> float:
    ref, q = ref.double(), q.double()
    return 10 * math.log10(float((ref ** 2).sum()) / float(((ref - q) ** 2).sum()))


def original_and_input(name: str, weights) -> tuple[nn.Module, torch.Tensor]:
    """The model with the weights the test saved, and the input archscan draws: seed 0, the
    constructor (its draws), then randn of the input's shape."""
    torch.manual_seed(0)
    model = globals()[name]().eval()
    x = torch.randn(INPUTS[name])
    model.load_state_dict(torch.load(weights))
    return model, x


def saved_weights(tmp_path, name: str, seed: int = 123) -> str:
    torch.manual_seed(seed)
    path = str(tmp_path / f"{name}.pt")
    torch.save(globals()[name]().state_dict(), path)
    return path


def run(capsys, *args, code: int = 0) -> tuple[str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    assert rc == code, err
    return out, err


def quantize_json(capsys, tmp_path, name: str, *args) -> dict:
    out, _ = run(capsys, "quantize", f"{HERE}:{name}", "--input", ",".join(map(str, INPUTS[name])), *args, "--json")
    return json.loads(out)


def quantized(data: dict) -> list[str]:
    return [l["module"] for l in data["layers"] if "kept" not in l]


# --- every scheme, checked here ---------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["int8", "w8a8", "fp8", "int4:g32"])
def test_each_scheme_drift_equals_the_saved_programs(scheme, capsys, tmp_path):
    """The saved program runs under plain torch.export.load; its SQNR against the original, computed
    here, equals the reported end-to-end SQNR (0.1 dB; the same inputs, so in fact to rounding), and
    its weights as stored equal the prediction."""
    weights, path = saved_weights(tmp_path, "Block"), str(tmp_path / f"block-{scheme}.pt2")
    data = quantize_json(capsys, tmp_path, "Block", "--scheme", scheme, "--weights", weights, "-o", path)
    assert data["schema"] == "archscan.quantize/1" and data["scheme"] == scheme
    # qkv is the first layer the forward runs, head the last: they stay; out, up, down are quantized
    assert quantized(data) == ["out", "up", "down"]
    # trained (here: given) weights: no random-weights note; int4 says which layout the CPU's is
    assert data["notes"] == ([INT4_ON_CPU] if scheme.startswith("int4") else [])
    model, x = original_and_input("Block", weights)
    program = torch.export.load(path)
    with torch.no_grad():
        ref, got = model(x), program.module()(x)
    here = sqnr(ref, got)
    assert abs(here - data["drift"]["sqnr_db"]) <= 0.1
    assert abs(here - data["saved"]["sqnr_db"]) <= 0.1 and data["saved"]["matches"]
    assert 10 < here < 60                          # quantized, not a copy, not noise
    cosine = float(F.cosine_similarity(ref.double().flatten(), got.double().flatten(), dim=0))
    assert cosine == pytest.approx(data["drift"]["cosine"], abs=1e-9)
    assert float((ref - got).abs().max()) == pytest.approx(data["drift"]["max_abs_err"], rel=1e-4)
    assert "top1" not in data["drift"]             # [B, T, 32]: not a classifier's 2-D logits
    # bytes as stored: the loaded program's parameters, a torchao weight by its inner storages
    stored = 0
    for n in program.graph_signature.parameters:
        t = program.state_dict[n]
        parts = [getattr(t, a) for a in t.__tensor_flatten__()[0]] if hasattr(t, "__tensor_flatten__") else [t]
        stored += sum(p.untyped_storage().nbytes() for p in parts)
    assert stored == data["saved"]["stored_bytes"] == data["saved"]["predicted_bytes"] == data["param_bytes_after"]
    replaced = {f"{p}.weight" for p in quantized(data)}
    kept_params = sum(p.numel() * 4 for n, p in model.named_parameters() if n not in replaced)  # float32, biases too
    assert data["param_bytes_after"] == kept_params + sum(l["stored_bytes"] for l in data["layers"] if "kept" not in l)


def test_per_layer_sqnr_against_torchaos_own_quantized_model(capsys, tmp_path):
    """Each quantized layer's output SQNR, computed here on a model torchao's quantize_ quantized
    with the reported layers, hooks on both."""
    weights = saved_weights(tmp_path, "Block")
    data = quantize_json(capsys, tmp_path, "Block", "--scheme", "int8", "--weights", weights,
                         "-o", str(tmp_path / "b.pt2"))
    model, x = original_and_input("Block", weights)
    q = original_and_input("Block", weights)[0]
    chosen = set(quantized(data))
    quantize_(q, config(parse_scheme("int8")), filter_fn=lambda m, fqn: fqn in chosen)
    seen: dict = {}
    for tag, m in (("ref", model), ("q", q)):
        for p in chosen:
            m.get_submodule(p).register_forward_hook(lambda mod, a, out, key=(tag, p): seen.__setitem__(key, out))
        with torch.no_grad():
            m(x)
    layers = {l["module"]: l for l in data["layers"]}
    for p in chosen:
        assert layers[p]["sqnr_db"] == pytest.approx(sqnr(seen["ref", p], seen["q", p]), abs=1e-6), p


def test_a_classifiers_top1_agreement(capsys, tmp_path):
    weights, path = saved_weights(tmp_path, "MLP"), str(tmp_path / "mlp.pt2")
    data = quantize_json(capsys, tmp_path, "MLP", "--scheme", "int4:g32", "--weights", weights, "-o", path)
    model, x = original_and_input("MLP", weights)
    with torch.no_grad():
        ref, got = model(x), torch.export.load(path).module()(x)
    agree = float((ref.argmax(1) == got.argmax(1)).double().mean())
    assert data["drift"]["rows"] == 256
    assert data["drift"]["top1"] == agree
    assert 0.8 < agree < 1.0   # int4 on random weights moves some arg-maxes, not most (here: 0.9x)


def test_the_program_loads_in_a_fresh_process(tmp_path, capsys):
    """Plain torch: a new interpreter that never imports archscan loads and runs the .pt2 (torch
    imports torchao itself for its tensor subclasses), at another batch size too."""
    path = str(tmp_path / "mlp.pt2")
    run(capsys, "quantize", f"{HERE}:MLP", "--input", "4,64", "--scheme", "int8", "-o", path)
    code = ("import sys, torch; p = torch.export.load(sys.argv[1]).module(); "
            "print(tuple(p(torch.randn(4, 64)).shape), tuple(p(torch.randn(3, 64)).shape), 'archscan' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "(4, 10) (3, 10) False"


def test_random_weights_say_so_and_are_still_checked(capsys, tmp_path):
    out, _ = run(capsys, "quantize", f"{HERE}:MLP", "--input", "8,64", "--scheme", "fp8", "-o", str(tmp_path / "m.pt2"))
    assert "note: the weights are random: the drift on them is not a verdict on a trained model's accuracy" in \
        " ".join(out.split())
    assert "end to end: SQNR" in out and "loaded back: SQNR" in out


def test_keep(capsys, tmp_path):
    path = str(tmp_path / "k.pt2")
    data = quantize_json(capsys, tmp_path, "Block", "--scheme", "int8", "--keep", "up", "-o", path)
    layers = {l["module"]: l for l in data["layers"]}
    assert layers["up"]["kept"] == "kept by --keep" and layers["up"]["stored_bytes"] == layers["up"]["weight_bytes"]
    assert quantized(data) == ["out", "down"]
    state = torch.export.load(path).state_dict
    assert type(state["up.weight"]) in (torch.Tensor, nn.Parameter)                    # as it was
    assert type(state["down.weight"]).__name__ == "Int8Tensor"                          # torchao's


def test_budget_quantizes_the_least_sensitive_layers_first(capsys, tmp_path):
    """Sensitivity: the end-to-end SQNR with the layer alone quantized, checked here for each
    candidate; the choice is the shortest prefix of the least sensitive first that fits."""
    weights = saved_weights(tmp_path, "Wide")
    model, x = original_and_input("Wide", weights)
    before = sum(p.numel() * 4 for p in model.parameters())
    # int8 stores a [n, k] weight in n*k + 5n bytes (qdata, float32 scale, int8 zero point per row)
    saves = {"m1": 256 * 96 * 4 - (256 * 96 + 5 * 256), "m2": 96 * 256 * 4 - (96 * 256 + 5 * 96),
             "m3": 96 * 96 * 4 - (96 * 96 + 5 * 96)}
    budget = before - saves["m2"] - saves["m3"] + 10      # two layers fit it; which two is the sensitivity's call
    data = quantize_json(capsys, tmp_path, "Wide", "--scheme", "int8", "--weights", weights, "--budget", f"{budget}B",
                         "-o", str(tmp_path / "w.pt2"))
    plan = data["budget"]
    alone = {}
    with torch.no_grad():
        ref = model(x)
        for p in saves:
            q = original_and_input("Wide", weights)[0]
            quantize_(q, config(parse_scheme("int8")), filter_fn=lambda m, fqn, p=p: fqn == p)
            alone[p] = sqnr(ref, q(x))
    assert {c["module"]: c["sqnr_db"] for c in plan["candidates"]} == pytest.approx(alone, abs=1e-6)
    order = sorted(alone, key=alone.get, reverse=True)
    assert order[-1] == "m1"                              # its large columns: the most sensitive
    chosen, total = [], before
    for p in order:
        if total <= budget:
            break
        chosen.append(p)
        total -= saves[p]
    assert sorted(quantized(data)) == sorted(chosen) == ["m2", "m3"]
    assert data["param_bytes_after"] == total <= budget < total + saves["m3"]
    assert data["saved"]["stored_bytes"] == total


def test_the_state_dict_where_export_cannot_carry_it(capsys, tmp_path, monkeypatch):
    """Export refused (made to fail here): the state dict and what rebuilds it go to a .pt beside -o,
    and that file, loaded as documented, drifts as reported."""
    import archscan.quant.apply as apply

    monkeypatch.setattr(apply, "_export", lambda *a: (None, "torch.export could not export the quantized model: x"))
    weights = saved_weights(tmp_path, "MLP")
    data = quantize_json(capsys, tmp_path, "MLP", "--scheme", "int8", "--weights", weights,
                         "-o", str(tmp_path / "m.pt2"))
    saved = data["saved"]
    assert saved["format"] == "archscan.quantized-state/1" and saved["path"] == str(tmp_path / "m.pt")
    assert saved["why"].startswith("torch.export could not") and not (tmp_path / "m.pt2").exists()
    found = torch.load(saved["path"], weights_only=True)       # tensors and plain data only
    model, x = original_and_input("MLP", weights)
    q = original_and_input("MLP", weights)[0]
    quantize_(q, config(parse_scheme(found["scheme"])), filter_fn=lambda m, fqn: fqn in found["quantized"])
    q.load_state_dict(found["state_dict"], assign=True)
    with torch.no_grad():
        assert sqnr(model(x), q(x)) == pytest.approx(data["drift"]["sqnr_db"], abs=0.1)


def test_a_program_that_drifts_otherwise_is_not_written(capsys, tmp_path, monkeypatch):
    """The check of the program loaded back can fail: here the program serialised is another
    model's (made so), so its drift is not the checked one's: exit 6, one line, nothing written and
    an earlier file at the path kept as it was."""
    real_save = torch.export.save
    other = torch.export.export(MLP().eval(), (torch.randn(4, 64),), strict=False)
    monkeypatch.setattr(torch.export, "save", lambda program, f, **kw: real_save(other, f, **kw))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.pt2").write_bytes(b"an earlier program")
    _, err = run(capsys, "quantize", f"{HERE}:MLP", "--input", "4,64", "--scheme", "int8", "-o", "m.pt2", code=6)
    assert err.count("\n") == 1 and "the saved file, loaded back, drifts" in err and "m.pt2 was not written" in err
    assert [p.name for p in tmp_path.iterdir()] == ["m.pt2"] and (tmp_path / "m.pt2").read_bytes() == b"an earlier program"


def test_the_library_call():
    result = archscan.quantize(MLP(), [(4, 64)], scheme="w8a8")
    assert result.saved is None and result.quantized == ["b", "c"] and result.to_json()["scheme"] == "w8a8"


# --- bad input: one line, a non-zero exit -------------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["--scheme", "int3"], "unknown quantization scheme 'int3'"),
    (["--scheme", "int8", "--keep", "nope"], "--keep nope matches no linear layer"),
    (["--scheme", "int8", "--keep", ".*"], "has nothing to quantize as int8: every nn.Linear stays in high precision"),
    (["--scheme", "int8", "--budget", "1KiB"], "is below what quantizing every candidate layer as int8 reaches"),
    (["--scheme", "int8", "--budget", "1GiB"], "already fit --budget"),
    (["--scheme", "int8", "--budget", "h100"], "cannot read --budget 'h100'"),
    (["--scheme", "int8", "-o", "/no/such/dir/m.pt2"], "cannot write -o /no/such/dir/m.pt2: no directory"),
])
def test_bad_input_is_one_line(args, says, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, err = run(capsys, "quantize", f"{HERE}:MLP", "--input", "4,64", *args, code=2)
    assert err.count("\n") == 1 and says in err, err
    assert list(tmp_path.iterdir()) == []               # nothing written


def test_a_model_without_linear_layers(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, err = run(capsys, "quantize", f"{HERE}:Convs", "--input", "1,3,16,16", "--scheme", "int8", code=2)
    assert err.count("\n") == 1 and "has nothing to quantize: it has no nn.Linear layer" in err


def test_torchao_missing(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "torchao", None)    # `import torchao` raises ImportError
    _, err = run(capsys, "quantize", f"{HERE}:MLP", "--input", "4,64", "--scheme", "int8", code=2)
    assert err.count("\n") == 1 and "quantization needs torchao" in err and "pip install 'archscan[quant]'" in err


# --- the models: ResNet-18, ViT-tiny and the zoo's Llama with given weights ------------------

@pytest.mark.parametrize("name,spec", [("resnet18", "2,3,64,64"), ("vit_tiny", "2,3,224,224"),
                                       ("llama_tiny", "2,16:int64")])
def test_zoo_models_with_given_weights(name, spec, capsys, tmp_path):
    """The saved program runs under plain torch.export.load, and its drift from the original,
    computed here on the inputs archscan drew, equals the drift reported (0.1 dB). The weights are
    drawn here (every float parameter normal, std 0.05: ViT's zero-initialised head would make every
    output a constant), saved, and given with --weights."""
    from archscan.load.building import build_real, make_call
    from archscan.load.targets import parse_input_spec, to_target

    torch.manual_seed(7)
    model = build_real(to_target(f"zoo:{name}"), {}, None)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    weights = str(tmp_path / f"{name}.pt")
    torch.save(model.state_dict(), weights)
    out = str(tmp_path / f"{name}-int8.pt2")
    data = json.loads(run(capsys, "quantize", f"zoo:{name}", "--input", spec, "--scheme", "int8", "--weights", weights,
                          "-o", out, "--json")[0])
    assert quantized(data)
    specs = [parse_input_spec(spec)]
    torch.manual_seed(0)  # as archscan draws them: seed 0, the constructor, then the inputs
    original = build_real(to_target(f"zoo:{name}"), {}, None, specs).eval()
    original.load_state_dict(torch.load(weights))
    call = make_call(specs, None)
    program = torch.export.load(out).module()
    with torch.no_grad():
        got = sqnr(call(original), call(program))
    assert 20 < got < 80 and got == pytest.approx(data["drift"]["sqnr_db"], abs=0.1)


class Deep(nn.Module):
    """Six 512-wide layers at batch 1: reading the weights is the forward's cost."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(512, 512) for _ in range(6))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def test_the_recommendations_apply_line_runs_and_keeps_its_promise(capsys, tmp_path, monkeypatch):
    """A scan recommends quantize where weights bound the forward; its apply line, run as printed,
    saves a program whose parameters shrink by the bytes the recommendation promised."""
    import shlex

    monkeypatch.chdir(tmp_path)
    data = json.loads(run(capsys, f"{HERE}:Deep", "--input", "1,512", "--json")[0])
    (rec,) = [r for r in data["recommendations"] if r["kind"] == "quantize"]
    args = shlex.split(rec["apply"])
    assert args[:2] == ["archscan", "quantize"]
    result = json.loads(run(capsys, *args[1:], "--json")[0])
    assert result["param_bytes"] - result["param_bytes_after"] == rec["estimated_saving"]["param_bytes"]
    assert (tmp_path / "Deep-int8.pt2").exists() and result["saved"]["bytes_match"]
