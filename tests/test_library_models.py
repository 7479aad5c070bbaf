"""Models as libraries build them: frozen config dicts on modules (diffusers), hooks a library
installs on its own modules (transformers 5's output capture, which vision-language models read),
beside the hooks a user adds. Hand-written models of each kind run everywhere; diffusers' and
transformers' own models are checked where the package is installed.

The FLOP oracle is ``torch.utils.flop_counter.FlopCounterMode`` on a real run (2 per
multiply-add; attention on the math backend, for which torch has formulas)."""

import os
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

import archscan

HF_DECODERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "hf_decoders.py")


def _torch_multiply_adds(model: nn.Module, *inputs, **kwargs) -> int:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with FlopCounterMode(display=False) as counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        model.eval()(*inputs, **kwargs)
    return counter.get_total_flops() // 2


class FrozenDict(dict):
    """diffusers' ``FrozenDict``: a config whose methods of change refuse (and ``clear`` too)."""

    def _refuse(self, *args, **kwargs):
        raise Exception("You cannot change a FrozenDict instance.")

    clear = update = pop = popitem = setdefault = __delitem__ = _refuse


class Configured(nn.Module):
    """A module whose config is a frozen dict, and which fills a cache of its own in forward."""

    def __init__(self):
        super().__init__()
        self._internal_dict = FrozenDict(channels=8, scale=2)
        self.cache = {}
        self.conv = nn.Conv2d(3, self._internal_dict["channels"], 3)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.conv(x) * self._internal_dict["scale"]
        self.cache["last"] = y.shape[-1]
        return self.fc(y.mean((2, 3)))


@pytest.mark.parametrize("method", ["auto", "fx", "eager", "export"])
def test_frozen_config_dicts_do_not_stop_a_scan(method):
    model = Configured()
    report = archscan.scan(model, [(1, 3, 10, 10)], capture_method=method, rules=[])
    # conv 8*3*9 per output pixel * 64 pixels, fc 8*4
    assert report.totals.flops == 8 * 3 * 9 * 64 + 32 == _torch_multiply_adds(Configured(), torch.randn(1, 3, 10, 10))
    assert isinstance(model._internal_dict, FrozenDict) and dict(model._internal_dict) == {"channels": 8, "scale": 2}
    assert model.cache == {}  # the capture's runs leave the module as it was


LIBRARY = '''\
import torch.nn as nn

_collected = []


def _collect(module, args, output):  # the library's own machinery: forward reads what it collects
    _collected.append(output)


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        for layer in self.layers:
            layer.register_forward_hook(_collect)

    def forward(self, x):
        _collected.clear()
        for layer in self.layers:
            x = layer(x)
        return _collected[-2] + 0  # the hidden state before the last layer, as a VLM projector reads it


def tower():
    return Tower()
'''


def _library(tmp_path, monkeypatch):
    pkg = tmp_path / "site-packages" / "towerlib"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(LIBRARY))
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    monkeypatch.delitem(sys.modules, "towerlib", raising=False)
    import towerlib

    return towerlib


@pytest.mark.parametrize("method", ["auto", "eager", "export"])
def test_hooks_a_library_installs_on_its_own_modules_run(tmp_path, monkeypatch, method):
    """The library's hooks stay (forward needs them); a user's hook is set aside, and the report
    says which."""
    towerlib = _library(tmp_path, monkeypatch)
    model = towerlib.tower()
    seen = []
    model.layers[0].register_forward_hook(lambda m, i, o: seen.append(o.numpy()))
    report = archscan.scan(model, [(2, 8)], capture_method=method, rules=[])
    assert seen == []
    assert report.totals.flops == 3 * 2 * 8 * 8 == _torch_multiply_adds(towerlib.tower(), torch.randn(2, 8))
    notes = [n for n in report.capture_notes if "forward hook" in n]
    assert len(notes) == 1 and "1 forward hook(s)" in notes[0] and "layers.0 (" in notes[0] and "<lambda>" in notes[0]
    assert len(model.layers[0]._forward_hooks) == 2  # the user's model keeps both


def test_hooks_from_the_users_own_code_are_set_aside():
    """A user's script defines the model and the hook: the hook is the user's, whatever file."""
    model = nn.Sequential(nn.Linear(4, 4))
    model[0].register_forward_hook(_users_hook)
    report = archscan.scan(model, [(1, 4)], rules=[])
    assert any("forward hook(s)" in n and "_users_hook" in n for n in report.capture_notes)


def _users_hook(module, args, output):
    raise AssertionError("a user's hook ran during the scan")


# --- the real libraries, where installed --------------------------------------------------------------

def test_diffusers_unet_and_vae_scan_exactly():
    diffusers = pytest.importorskip("diffusers")
    unet = diffusers.UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8)
    args = (torch.randn(1, 4, 16, 16), torch.tensor([10]), torch.randn(1, 7, 32))
    report = archscan.scan(unet, list(args), recommend=False)
    assert report.totals.params == sum(p.numel() for p in unet.parameters())
    assert report.totals.flops == _torch_multiply_adds(unet, *args)
    vae = diffusers.AutoencoderKL(block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
                                  up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=8)
    report = archscan.scan(vae, [(1, 3, 32, 32)], recommend=False)
    assert report.totals.params == sum(p.numel() for p in vae.parameters())
    assert report.totals.flops == _torch_multiply_adds(vae, torch.randn(1, 3, 32, 32))


def test_llava_after_a_forward_keeps_transformers_output_hooks():
    """transformers 5 installs its hidden-state hooks at the first forward; LLaVA's projector reads
    what they collect. A scan of a model that has run keeps them."""
    transformers = pytest.importorskip("transformers")
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, image_size=32, patch_size=8)
    text = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    config = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_index=127,
                                      vision_feature_layer=-2)
    torch.manual_seed(0)
    model = transformers.LlavaForConditionalGeneration(config).eval()
    ids = torch.randint(0, 100, (1, 24))
    ids[0, 2:18] = 127  # 16 image tokens: (32 / 8) ** 2 patches
    pixels = torch.randn(1, 3, 32, 32)
    want = _torch_multiply_adds(model, input_ids=ids, pixel_values=pixels)
    assert sum(len(m._forward_hooks) for m in model.modules()) > 0
    report = archscan.scan(model, [ids, pixels], recommend=False)
    assert report.totals.flops == want
    assert not any("forward hook" in n for n in report.capture_notes)


class ScalarOnTheHost(nn.Module):
    def forward(self, x):
        return x * torch.tensor(0.5) + torch.tensor([1.0, 2.0])  # a number, and a 2-element tensor per call


@pytest.mark.parametrize("method", ["fx", "export", "eager"])
def test_a_host_scalar_is_a_number_not_a_copy(method):
    """A 0-dim tensor made on the host (transformers' sliding-window caches wrap their window size
    so) is taken by a GPU kernel as a number, with no copy: only the 2-element tensor is flagged."""
    report = archscan.scan(ScalarOnTheHost(), [(4, 2)], capture_method=method, recommend=False)
    (finding,) = [f for f in report.findings if f.rule == "host-tensor"]
    assert finding.saving["copies"] == 1


def test_transformers_sliding_window_cache_is_not_a_host_tensor():
    transformers = pytest.importorskip("transformers")
    config = transformers.MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=128, sliding_window=8)
    report = archscan.scan(transformers.MistralForCausalLM(config), ["1,16:int64"], recommend=False)
    assert not [f for f in report.findings if f.rule in ("host-tensor", "host-sync")]


def test_a_hybrid_state_space_model_gets_a_speed_grid():
    """Bamba pads its sequence to chunks of its scan: polynomial only on multiples of the chunk. The
    fit moves to such multiples, and a grid point run on its own predicts the same to the last bit.
    Qwen3-Next's prefill loops over chunks in Python (more ops the longer the context): no grid, and why."""
    pytest.importorskip("transformers")
    from archscan.llm.decode import decode_step
    from archscan.load.targets import parse_input_spec, resolve_target
    from archscan.measure import datasheet_profile

    h100 = datasheet_profile("h100")
    bamba = resolve_target(f"{HF_DECODERS}:tiny_bamba")
    speed = decode_step(bamba, [parse_input_spec("1,1:int64")], 64, profile=h100, grid=True)["kv_cache"]["speed"]
    assert "why" not in speed and speed["fitted_contexts"][0] > 16
    assert [(c["batch"], c["context"]) for c in speed["cells"]] == [(b, 2048) for b in (1, 8, 32, 128)]
    for batch in (1, 8):
        alone = decode_step(bamba, [parse_input_spec(f"{batch},1:int64")], 2048, profile=h100)["phases"]
        (cell,) = [c for c in speed["cells"] if c["batch"] == batch]
        assert (cell["decode_ms"], cell["ttft_ms"]) == (alone["decode"]["predicted_ms"], alone["prefill"]["predicted_ms"])
        assert (cell["served_decode_ms"], cell["served_ttft_ms"]) == (alone["decode"]["served_ms"],
                                                                       alone["prefill"]["served_ms"])
    qwen = resolve_target(f"{HF_DECODERS}:tiny_qwen3_next")
    speed = decode_step(qwen, [parse_input_spec("1,1:int64")], 64, profile=h100, grid=True)["kv_cache"]["speed"]
    assert speed["cells"] == [] and "more ops the longer the context" in speed["why"]


@pytest.mark.parametrize("name", ["tiny_mixtral", "tiny_phimoe", "tiny_gpt_oss", "tiny_llama4"])
def test_active_parameters_follow_the_routers_k(name):
    """Active parameters per token: everything but the experts, plus k of E experts per layer. Mixtral
    routes with a top-k; PhiMoE's sparsemixer takes two maxes and concatenates them (read as k = 2,
    not 1); GPT-OSS gathers its per-expert biases by the routed rows' expert ids (k of E rows active);
    Llama-4 runs every expert on every token, and still uses k of E per token."""
    pytest.importorskip("transformers")
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_decoders", HF_DECODERS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = getattr(module, name)()
    config = model.config
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    total = sum(p.numel() for p in model.parameters())
    active = total - experts + experts * config.num_experts_per_tok // config.num_local_experts
    report = archscan.scan(model, ["1,16:int64"], rules=[], recommend=False, profile=False)
    assert report.totals.params == total and report.totals.active_params == active


def test_experts_run_on_every_token_are_named():
    """Llama-4's code runs all E experts on every token: its expert GEMMs count as written (by hand:
    T·E·(h·2I + I·h) per layer), the dense-experts finding names E/k times the routed work, and a
    top-k MoE that routes (Mixtral) has no such finding."""
    pytest.importorskip("transformers")
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_decoders", HF_DECODERS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.tiny_llama4()
    c = model.config
    tokens, e, k, h, inter = 16, c.num_local_experts, c.num_experts_per_tok, c.hidden_size, c.intermediate_size
    report = archscan.scan(model, [f"1,{tokens}:int64"], recommend=False, profile=False)
    (finding,) = [f for f in report.findings if f.rule == "dense-experts"]
    written = c.num_hidden_layers * tokens * e * (h * 2 * inter + inter * h)
    assert finding.evidence["expert_flops"] == written
    assert finding.evidence["routed_flops"] == written * k // e and finding.saving["flops"] == written - written * k // e
    assert f"{e // k}.0x" in finding.message
    mixtral = archscan.scan(module.tiny_mixtral(), [f"1,{tokens}:int64"], recommend=False, profile=False)
    assert not [f for f in mixtral.findings if f.rule == "dense-experts"]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_causal_discount_whatever_the_attention_is_written_as(attention):
    """Executed multiply-adds credit the causal mask the same way for SDPA (which the CPU decomposes
    when the value head differs from the query's: DeepSeek's latent attention) and for eager attention
    (scores, the mask added, softmax, ·V): per layer, QKᵀ and PV over S(S+1)/2 of the S² pairs."""
    pytest.importorskip("transformers")
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_decoders", HF_DECODERS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.tiny_deepseek_v2(attention)
    c = model.config
    s, heads, qk, v = 64, c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim
    report = archscan.scan(model, [f"1,{s}:int64"], recommend=False, rules=[])
    dense = c.num_hidden_layers * heads * s * s * (qk + v)
    assert report.totals.flops - report.totals.executed_flops == dense - dense * (s * (s + 1) // 2) // (s * s)
