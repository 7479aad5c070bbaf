"""``archscan prune``: coupled channel groups, module surgery, the counts, the CLI and the recommendation.

Every claim is checked against something computed here on real weights, not by archscan's own
bookkeeping:

- a group is exact when zeroing what produces some of its channels (conv/linear output rows, norm
  weights and biases, embedding columns) makes the consumers' inputs exactly 0 at the group's
  indices for those channels, and not elsewhere (forward pre-hooks on the real model);
- surgery is exact when the pruned program computes what the original computes with the cut
  channels zeroed;
- a saved ``.pt2`` is loaded with plain ``torch.export.load`` in a fresh process without archscan.
"""

import functools
import json
import os
import re
import shlex
import subprocess
import tempfile
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn as nn

import archscan
from archscan import zoo
from archscan.load.targets import input_specs, to_target
from archscan.cli import main
from archscan.errors import ArchscanError
from archscan.prune import analyse, kept_channels, plan, prune
from archscan.transform.weights import randomize_batch_norms

INPUTS = {"resnet18": "1,3,64,64", "mobilenet_v2": "1,3,64,64", "shufflenet_v2_x0_5": "1,3,64,64",
          "llama_tiny": "1,16:int64"}
RTOL = 1e-5
_CONV = nn.modules.conv._ConvNd
_RUNNING = ("running_mean", "running_var", "num_batches_tracked")

# Peak RSS of a subprocess in KiB (as in test_real_models.py): VmHWM belongs to the new program.
PEAK_KIB = ("next((int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmHWM')), None) "
            "or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss")


# --- helpers ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def grouping(name: str):
    return analyse(to_target(f"zoo:{name}"), input_specs(INPUTS[name]))


def real_model(name: str, seed: int = 0) -> nn.Module:
    """The zoo model with real (seeded random) weights, batch norms randomised so that no channel is
    trivially zero or trivially the same as another."""
    torch.manual_seed(seed)
    model = zoo.create_model(name).eval()
    randomize_batch_norms(model)
    return model


def example(name: str, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if name == "llama_tiny":
        return torch.randint(0, 32000, (1, 16), generator=g)
    return torch.randn(1, 3, 64, 64, generator=g)


def members(g) -> set:
    return {(m.param, m.dim) for m in g.members}


def bn(prefix: str) -> set:
    return {(f"{prefix}.{a}", 0) for a in ("weight", "bias", "running_mean", "running_var")}


def consumer(model: nn.Module, param: str, dim: int):
    """The module when (param, dim) is the input dim of a conv (groups=1) or linear weight, else None."""
    path, _, attr = param.rpartition(".")
    if dim != 1 or attr != "weight":
        return None
    module = model.get_submodule(path)
    if isinstance(module, nn.Linear) or (isinstance(module, _CONV) and not module.transposed and module.groups == 1):
        return module
    return None


def zeroable(model: nn.Module, group) -> bool:
    """Every member is a parameter, a consumer's input dim or a batch norm's running statistic (a
    buffer such as a rotary table cannot be zeroed meaningfully)."""
    params = dict(model.named_parameters())
    return all(p in params or p.rpartition(".")[2] in _RUNNING for p, _ in members(group))


def zero_channels(model: nn.Module, group, channels: np.ndarray) -> None:
    """Zero, for ``channels`` (positions in the group), every member slice that is not a consumer's
    input dim: producers' output rows, biases, norm weights and biases, embedding columns. Running
    statistics are left alone: a norm whose weight and bias are 0 outputs 0 whatever they are; so
    are other buffers (a rotary table: ``zeroable`` keeps such groups out of the generic check)."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for (param, dim), idx in group.indices.items():
            if param not in params or consumer(model, param, dim) is not None:
                continue
            params[param].index_fill_(dim, torch.as_tensor(idx[channels].ravel(), dtype=torch.long), 0.0)


def consumer_inputs(model: nn.Module, names, x) -> dict[str, torch.Tensor]:
    """What each named module receives, with its channel dim moved first."""
    seen: dict[str, torch.Tensor] = {}

    def hook(name, module, args):
        t = args[0].detach()
        seen[name] = t.movedim(1 if isinstance(module, _CONV) else -1, 0).clone()

    handles = [model.get_submodule(n).register_forward_pre_hook(functools.partial(hook, n)) for n in names]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    assert set(seen) == set(names)
    return seen


def check_group_exact(model: nn.Module, group, x) -> None:
    """Zero all channels of the group, then each half of them (seeded): consumers' inputs are exactly
    0 at the zeroed channels' indices, and not all 0 at their other indices."""
    consumers = {p.rpartition(".")[0]: idx for (p, d), idx in group.indices.items() if consumer(model, p, d) is not None}
    assert consumers
    params = dict(model.named_parameters())
    saved = {p: params[p].detach().clone() for p, _ in members(group) if p in params}
    perm = np.random.default_rng(group.id).permutation(group.channels)
    passes = [np.arange(group.channels)]
    if group.channels > 1:
        passes += [np.sort(perm[:group.channels // 2]), np.sort(perm[group.channels // 2:])]
    try:
        for channels in passes:
            zero_channels(model, group, channels)
            seen = consumer_inputs(model, list(consumers), x)
            for name, idx in consumers.items():
                t = seen[name]
                zeroed = np.unique(idx[channels].ravel())
                others = np.setdiff1d(np.arange(t.shape[0]), zeroed)
                assert torch.count_nonzero(t[torch.as_tensor(zeroed)]) == 0, \
                    (group.id, name, "input not exactly 0 at the group's indices")
                if len(others):
                    assert torch.count_nonzero(t[torch.as_tensor(others)]) > 0, \
                        (group.id, name, "input 0 everywhere: the check would prove nothing")
            with torch.no_grad():
                for p, t in saved.items():
                    params[p].copy_(t)
    finally:
        with torch.no_grad():
            for p, t in saved.items():
                params[p].copy_(t)


# --- 1. coupled groups are exact, on real weights ----------------------------------------------------

# Groups with a consumer (a conv/linear input dim) that are proven exact on real weights, at least:
#   resnet18: every group but fc's output (12); mobilenet_v2: every group but the classifier's (25);
#   shufflenet_v2_x0_5: every group but fc's (86: the channel shuffle splits each stage's channels
#   into many small groups, by which later unit consumes them); llama_tiny: the residual stream,
#   4 v->o and 4 gate/up->down groups (9; q<->k and the logits have no consumer: see the SDPA test).
MIN_CHECKED = {"resnet18": 12, "mobilenet_v2": 25, "shufflenet_v2_x0_5": 86, "llama_tiny": 9}


@pytest.mark.parametrize("name", list(INPUTS))
def test_groups_are_exact_on_real_weights(name):
    """Each group's members suffice to silence its channels, at exactly the indices the group names
    for each consumer. (That no member is missing is proved by surgery: a member left out would keep
    its dim, and the pruned model would not run or not match the zeroed original; tests 2 and 3.)"""
    model = real_model(name)
    x = example(name)
    checked = skipped = 0
    for g in grouping(name).groups:
        if not any(consumer(model, p, d) is not None for p, d in members(g)):
            continue
        if not zeroable(model, g):
            skipped += 1
            continue
        check_group_exact(model, g, x)
        checked += 1
    assert checked >= MIN_CHECKED[name], (checked, skipped)


def test_resnet18_groups():
    gs = grouping("resnet18").groups
    expected = []
    # stem + layer1: conv1's channels and layer1's two residual adds are one group of 64
    stage1 = {("conv1.weight", 0)} | bn("bn1") | {("layer2.0.conv1.weight", 1), ("layer2.0.downsample.0.weight", 1)}
    for b in (0, 1):
        stage1 |= {(f"layer1.{b}.conv2.weight", 0), (f"layer1.{b}.conv1.weight", 1)} | bn(f"layer1.{b}.bn2")
    expected.append((stage1, 64, None))
    for s in (1, 2, 3, 4):
        c = 64 << (s - 1)
        for b in (0, 1):  # each basic block's inner channels: conv1 out, bn1, conv2 in
            expected.append(({(f"layer{s}.{b}.conv1.weight", 0), (f"layer{s}.{b}.conv2.weight", 1)}
                             | bn(f"layer{s}.{b}.bn1"), c, None))
        if s > 1:  # one residual group per stage, with the projection shortcut
            res = {(f"layer{s}.0.downsample.0.weight", 0), (f"layer{s}.1.conv1.weight", 1)} | bn(f"layer{s}.0.downsample.1")
            for b in (0, 1):
                res |= {(f"layer{s}.{b}.conv2.weight", 0)} | bn(f"layer{s}.{b}.bn2")
            res |= ({(f"layer{s + 1}.0.conv1.weight", 1), (f"layer{s + 1}.0.downsample.0.weight", 1)} if s < 4
                    else {("fc.weight", 1)})
            expected.append((res, c, None))
    expected.append(({("fc.weight", 0), ("fc.bias", 0)}, 1000, "reaches the model's output"))
    assert len(gs) == 13
    got = sorted((sorted(members(g)), g.channels, g.pinned) for g in gs)
    assert got == sorted((sorted(m), c, p) for m, c, p in expected)
    assert [g.id for g in gs] == list(range(13))
    assert all(idx.shape == (g.channels, 1) for g in gs for idx in g.indices.values())


def test_mobilenet_v2_groups():
    gs = grouping("mobilenet_v2").groups
    assert len(gs) == 26
    by_members = {frozenset(members(g)): g for g in gs}
    # every inverted residual with an expansion: expand conv, its BN, the depthwise conv (dim 0) and
    # its BN, and the project conv's input are one group
    widths = [96, 144, 144, 192, 192, 192, 384, 384, 384, 384, 576, 576, 576, 960, 960, 960]
    for i, width in zip(range(2, 18), widths):
        p = f"features.{i}.conv"
        expected = ({(f"{p}.0.0.weight", 0), (f"{p}.1.0.weight", 0), (f"{p}.2.weight", 1)}
                    | bn(f"{p}.0.1") | bn(f"{p}.1.1"))
        g = by_members.get(frozenset(expected))
        assert g is not None, i
        assert g.channels == width and g.pinned is None
    # the residual adds couple the project convs of a stage
    producers = {tuple(g.producers) for g in gs}
    for blocks in ((2, 3), (4, 5, 6), (7, 8, 9, 10), (11, 12, 13), (14, 15, 16)):
        assert tuple(sorted(f"features.{b}.conv.2.weight" for b in blocks)) in producers, blocks
    assert gs[-1].pinned == "reaches the model's output" and gs[-1].producers == ["classifier.1.weight"]


def test_shufflenet_v2_groups():
    gs = grouping("shufflenet_v2_x0_5").groups
    by_members = {frozenset(members(g)): g for g in gs}
    units = [f"stage{s}.{u}" for s, n in ((2, 4), (3, 8), (4, 4)) for u in range(n)]
    for unit in units:  # branch2's inner channels: 1x1 out -> BN -> depthwise -> BN -> 1x1 in
        b = f"{unit}.branch2"
        expected = {(f"{b}.0.weight", 0), (f"{b}.3.weight", 0), (f"{b}.5.weight", 1)} | bn(f"{b}.1") | bn(f"{b}.4")
        g = by_members.get(frozenset(expected))
        assert g is not None, unit
        assert g.pinned is None and g.channels >= 16
    # the stage-level channels (every unit's outputs) pass the channel shuffle's view: pinned, and
    # the groups holding one layer's outputs cover all of them
    outputs = [(f"{u}.branch2.5.weight", 0) for u in units] + [(f"stage{s}.0.branch1.2.weight", 0) for s in (2, 3, 4)]
    for key in outputs:
        holding = [g for g in gs if key in members(g)]
        assert holding and all(g.pinned is not None and "view" in g.pinned for g in holding), key
        assert sum(g.channels for g in holding) == grouping("shufflenet_v2_x0_5").param_shapes[key[0]][0]
    assert sum(1 for g in gs if g.pinned is None) == len(units) + 2  # + the stem and conv5


def test_llama_tiny_groups():
    gs = grouping("llama_tiny").groups
    layers = range(4)
    lp = "layers.{}."
    residual = {("tok_embeddings.weight", 1), ("norm.weight", 0), ("output.weight", 1)}
    for i in layers:
        p = lp.format(i)
        residual |= {(p + "attention_norm.weight", 0), (p + "ffn_norm.weight", 0),
                     (p + "attention.wo.weight", 0), (p + "feed_forward.w2.weight", 0)}
        residual |= {(p + f"attention.{w}.weight", 1) for w in ("wq", "wk", "wv")}
        residual |= {(p + f"feed_forward.{w}.weight", 1) for w in ("w1", "w3")}
    by_members = {frozenset(members(g)): g for g in gs}
    g = by_members[frozenset(residual)]
    assert g.channels == 256 and g.pinned is None
    for i in layers:
        p = lp.format(i)
        ffn = by_members[frozenset({(p + "feed_forward.w1.weight", 0), (p + "feed_forward.w3.weight", 0),
                                    (p + "feed_forward.w2.weight", 1)})]
        assert ffn.channels == 768 and ffn.pinned is None
        vo = by_members[frozenset({(p + "attention.wv.weight", 0), (p + "attention.wo.weight", 1)})]
        # 4 kv heads x 32 serve 8 query heads: v channel j reaches wo inputs of query heads 2h and 2h+1
        j = np.arange(128)
        assert vo.channels == 128 and "view" in vo.pinned
        assert np.array_equal(vo.indices[(p + "attention.wo.weight", 1)],
                              np.stack([(2 * (j // 32)) * 32 + j % 32, (2 * (j // 32) + 1) * 32 + j % 32], 1))
    # q <-> k: ONE group for all layers. Each layer's q and k are multiplied by the same rope.cos /
    # rope.sin tables (one buffer pair, shared by every layer), so index d of every layer's q and k
    # heads is united with table column d; rotate_half pairs d with d + 16. Channel c is thus
    # {h * 32 + c, h * 32 + c + 16} of every head h, in every layer.
    qk = [g for g in gs if ("layers.0.attention.wq.weight", 0) in members(g)]
    assert len(qk) == 1
    qk = qk[0]
    expected = {("rope.cos", 1), ("rope.sin", 1)}
    for i in layers:
        expected |= {(lp.format(i) + "attention.wq.weight", 0), (lp.format(i) + "attention.wk.weight", 0)}
    assert members(qk) == expected
    assert qk.channels == 16 and "view" in qk.pinned
    c = np.arange(16)[:, None]
    for i in layers:
        q = qk.indices[(lp.format(i) + "attention.wq.weight", 0)]
        k = qk.indices[(lp.format(i) + "attention.wk.weight", 0)]
        assert np.array_equal(np.sort(q, 1), np.sort(np.hstack([h * 32 + c + s for h in range(8) for s in (0, 16)]), 1))
        assert np.array_equal(np.sort(k, 1), np.sort(np.hstack([h * 32 + c + s for h in range(4) for s in (0, 16)]), 1))
    assert gs[-1].pinned == "reaches the model's output" and members(gs[-1]) == {("output.weight", 0)}
    assert len(gs) == 11


def test_llama_q_k_group_is_exact_at_attention(monkeypatch):
    """q <-> k has no conv/linear consumer: zeroing its producers (wq and wk rows) for half its
    channels leaves q and k exactly 0 there after the rotary embedding, in every layer."""
    model, x = real_model("llama_tiny"), example("llama_tiny")
    g = next(g for g in grouping("llama_tiny").groups if ("layers.0.attention.wq.weight", 0) in members(g))
    channels = np.arange(0, 16, 2)
    zero_channels(model, g, channels)  # wq / wk rows (rope tables are buffers: left alone)
    seen = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        seen.append((q.detach().transpose(1, 2).flatten(2), k.detach().transpose(1, 2).flatten(2)))
        return real_sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        model(x)
    assert len(seen) == 4
    for i, (q, k) in enumerate(seen):  # k after repeat_kv: [B, T, 8 * 32] like q
        qi = g.indices[(f"layers.{i}.attention.wq.weight", 0)][channels].ravel()
        assert torch.count_nonzero(q[..., torch.as_tensor(qi)]) == 0
        assert torch.count_nonzero(k[..., torch.as_tensor(qi)]) == 0
        rest = torch.as_tensor(np.setdiff1d(np.arange(256), qi))
        assert torch.count_nonzero(q[..., rest]) > 0 and torch.count_nonzero(k[..., rest]) > 0


# --- 2. pruned models run and count what was predicted ----------------------------------------------

@pytest.fixture(scope="module")
def pruned_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("pruned")


@functools.lru_cache(maxsize=None)
def _pruned(name: str, ratio: float, where: str):
    path = os.path.join(where, f"{name}-{ratio}.pt2")
    return prune(to_target(f"zoo:{name}"), input_specs(INPUTS[name]), ratio=ratio, path=path), path


def _program_tensors(program) -> dict[str, torch.Tensor]:
    return {**program.constants, **program.state_dict}


@pytest.mark.parametrize("ratio", [0.3, 0.5])
@pytest.mark.parametrize("name", list(INPUTS))
def test_pruned_counts_equal_prediction(name, ratio, pruned_dir):
    result, path = _pruned(name, ratio, str(pruned_dir))
    keys = ("params", "flops", "mac_bytes", "kernels")
    assert {k: result.after[k] for k in keys} == {k: result.predicted[k] for k in keys}
    assert result.after["params"] < result.before["params"]
    assert result.after["flops"] < result.before["flops"]
    assert result.left_out == () and result.path == path and os.path.isfile(path)
    # each cut group keeps a multiple of 8, and every parameter of the program has exactly the shape
    # its original loses the cut channels from
    gs = grouping(name)
    removed: dict[tuple[str, int], int] = {}
    for row in result.groups:
        g = gs.group(row["id"])
        assert row["channels"] == g.channels and row["kept"] == g.channels - row["cut"]
        assert row["kept"] % 8 == 0 and row["cut"] > 0 and g.pinned is None
        assert row["kept"] == kept_channels(g.channels, ratio)
        for (param, dim), idx in g.indices.items():
            removed[(param, dim)] = removed.get((param, dim), 0) + row["cut"] * idx.shape[1]
    tensors = _program_tensors(result.program)
    convs_and_linears = 0
    for param, shape in gs.param_shapes.items():
        want = tuple(s - removed.get((param, d), 0) for d, s in enumerate(shape))
        if param.endswith("num_batches_tracked"):
            continue
        assert tuple(tensors[param].shape) == want, param
        if len(shape) >= 2 and "embeddings" not in param and "rope" not in param:
            convs_and_linears += 1
            assert all(s % 8 == 0 or s == shape[d] for d, s in enumerate(want) if d < 2), (param, want)
    assert convs_and_linears > 0


def test_saved_programs_load_with_plain_torch(pruned_dir):
    jobs = []
    for name in INPUTS:
        model = zoo.create_model(name).eval()
        with torch.no_grad():
            shape = list(model(example(name)).shape)
        for ratio in (0.3, 0.5):
            jobs.append((_pruned(name, ratio, str(pruned_dir))[1], name == "llama_tiny", shape))
    code = textwrap.dedent("""
        import json, sys, torch
        shapes = []
        for path, tokens, _ in json.loads(sys.argv[1]):
            x = torch.randint(0, 32000, (1, 16)) if tokens else torch.randn(1, 3, 64, 64)
            with torch.no_grad():
                y = torch.export.load(path).module()(x)
            shapes.append(list(y.shape))
        print(json.dumps({"shapes": shapes, "archscan": any(m.split(".")[0] in ("archscan", "zoo") for m in sys.modules)}))
    """)
    out = subprocess.run([sys.executable, "-c", code, json.dumps(jobs)], capture_output=True, text=True,
                         timeout=120, cwd=str(pruned_dir))
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["archscan"] is False
    assert data["shapes"] == [shape for _, _, shape in jobs]


# --- 3. surgery removes exactly the cut channels ----------------------------------------------------

def test_pruned_output_equals_original_with_cut_channels_zeroed(tmp_path):
    model = real_model("resnet18")
    weights = str(tmp_path / "resnet18.pt")
    torch.save(model.state_dict(), weights)
    result = prune(to_target("zoo:resnet18"), input_specs(INPUTS["resnet18"]), ratio=0.3, weights=weights)
    assert result.importance == "weights"
    gs = grouping("resnet18")
    cuts = plan(gs, 0.3, model=model)
    assert [(g.id, len(c)) for g, c in cuts] == [(r["id"], r["cut"]) for r in result.groups]
    # the program holds exactly the original's kept slices (so prune cut what plan() chose)
    tensors, original = _program_tensors(result.program), model.state_dict()
    drops: dict[tuple[str, int], np.ndarray] = {}
    for g, channels in cuts:
        for key, idx in g.indices.items():
            drops[key] = np.union1d(drops.get(key, np.array([], dtype=np.int64)), idx[channels].ravel())
    for param, t in original.items():
        if param.endswith("num_batches_tracked"):
            continue
        kept = t
        for dim in range(t.dim()):
            if (param, dim) in drops:
                keep = np.setdiff1d(np.arange(t.shape[dim]), drops[(param, dim)])
                kept = kept.index_select(dim, torch.as_tensor(keep))
        assert torch.equal(tensors[param], kept), param
    # and computes what the original computes with those channels zeroed
    for g, channels in cuts:
        zero_channels(model, g, channels)
    x = example("resnet18")
    with torch.no_grad():
        want = model(x)
        got = result.program.module()(x)
    assert got.shape == want.shape
    assert (got - want).abs().max() <= RTOL * want.abs().max()
    assert want.abs().max() > 0


# --- 4. importance from the weights ---------------------------------------------------------------

def test_channels_with_tiny_filters_are_the_ones_cut(tmp_path):
    model = real_model("resnet18")
    g = grouping("resnet18").group(1)  # layer1.0.conv1 -> bn1 -> conv2: 64 channels, 16 cut at 0.3
    assert members(g) == {("layer1.0.conv1.weight", 0), ("layer1.0.conv2.weight", 1)} | bn("layer1.0.bn1")
    tiny = np.sort(np.random.default_rng(3).choice(64, 16, replace=False))
    state = model.state_dict()
    state["layer1.0.conv1.weight"][torch.as_tensor(tiny)] *= 1e-3
    state["layer1.0.bn1.weight"][torch.as_tensor(tiny)] *= 1e-3
    weights = str(tmp_path / "w.pt")
    torch.save(state, weights)
    result = prune(to_target("zoo:resnet18"), input_specs(INPUTS["resnet18"]), ratio=0.3, group_ids=[1], weights=weights)
    assert result.importance == "weights" and result.weights == weights
    assert [(r["id"], r["channels"], r["kept"], r["cut"]) for r in result.groups] == [(1, 64, 48, 16)]
    keep = torch.as_tensor(np.setdiff1d(np.arange(64), tiny))
    tensors = _program_tensors(result.program)
    assert torch.equal(tensors["layer1.0.conv1.weight"], state["layer1.0.conv1.weight"][keep])
    assert torch.equal(tensors["layer1.0.bn1.weight"], state["layer1.0.bn1.weight"][keep])
    assert torch.equal(tensors["layer1.0.conv2.weight"], state["layer1.0.conv2.weight"][:, keep])
    # without weights: structural, the last channels
    structural = prune(to_target("zoo:resnet18"), input_specs(INPUTS["resnet18"]), ratio=0.3, group_ids=[1])
    assert structural.importance == "structural" and structural.weights is None
    (group, channels), = plan(grouping("resnet18"), 0.3, [1])
    assert group.id == 1 and list(channels) == list(range(48, 64))


# --- 5. kept channel arithmetic --------------------------------------------------------------------

def test_kept_channels():
    # kept = max(8, ceil(channels * (1 - ratio) / 8) * 8), at most channels: rounded up, so a cut
    # never exceeds the ratio asked for
    assert kept_channels(64, 0.3) == 48       # 44.8 / 8 = 5.6 -> 6
    assert kept_channels(1024, 0.3) == 720    # 716.8 / 8 = 89.6 -> 90
    assert kept_channels(2048, 0.3) == 1440   # 1433.6 / 8 = 179.2 -> 180
    assert kept_channels(58, 0.5) == 32       # 29 / 8 = 3.625 -> 4
    assert kept_channels(40, 0.5) == 24       # 20 -> rounded up: a cut never exceeds the ratio
    assert kept_channels(16, 0.3) == 16       # 11.2 -> 16: nothing to cut at 0.3
    assert kept_channels(16, 0.99) == 8       # never below 8
    assert kept_channels(64, 0.0) == 64
    for small in (1, 3, 8, 15):               # fewer than 16 channels: untouched
        assert kept_channels(small, 0.5) == small
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ArchscanError, match="not a fraction"):
            kept_channels(64, bad)


# --- 6. the command line ---------------------------------------------------------------------------

def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, *needles):
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("archscan: error:") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


R18 = ("prune", "zoo:resnet18", "--input", INPUTS["resnet18"])


def test_cli_list(capsys):
    code, out, err = run(capsys, *R18, "--list", "--ratio", "0.5")
    assert code == 0, err
    assert out.startswith("13 coupled channel groups, 12 can be cut")
    assert re.findall(r"^group (\d+):", out, re.M) == [str(i) for i in range(13)]
    assert "kept: reaches the model's output" in out
    assert out.count("cut 0.5: keep ") == 12


def test_cli_list_json(capsys):
    code, out, err = run(capsys, *R18, "--list", "--json", "--ratio", "0.5")
    assert code == 0, err
    data = json.loads(out)
    assert data["schema"] == "archscan.groups/1" and len(data["groups"]) == 13


def test_cli_prune_json(capsys, tmp_path):
    path = str(tmp_path / "x.pt2")
    code, out, err = run(capsys, *R18, "--ratio", "0.5", "-o", path, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["schema"] == "archscan.prune/1" and data["path"] == path and os.path.isfile(path)
    assert data["after"]["params"] < data["before"]["params"] and len(data["groups"]) == 12


def test_cli_prune_text(capsys, tmp_path):
    path = str(tmp_path / "x.pt2")
    code, out, err = run(capsys, *R18, "--ratio", "0.5", "-o", path)
    assert code == 0, err
    assert "as predicted" in out and "12 group(s) at --ratio 0.5" in out and os.path.isfile(path)


def test_cli_errors(capsys):
    one_line_error(*run(capsys, *R18, "--group", "99")[::2], "no channel group 99", "0..12")
    one_line_error(*run(capsys, *R18, "--group", "12")[::2], "group 12 cannot be cut", "reaches the model's output")
    one_line_error(*run(capsys, *R18, "--ratio", "1.5")[::2], "--ratio 1.5")


def test_vit_residual_group_left_out_for_multihead_attention(tmp_path):
    """nn.MultiheadAttention checks its input width: the residual stream (group 0) cannot be cut by
    surgery, so the default prune leaves it out with the reason and still cuts every MLP group.
    (vit_tiny at 32x32 with 2 blocks: the same layers, in a fraction of the time.)"""
    target, specs, kwargs = to_target("zoo:vit_tiny"), input_specs("1,3,32,32"), {"image_size": 32, "depth": 2}
    residual = analyse(target, specs, kwargs).group(0)
    assert residual.pinned is None
    assert {("conv_proj.weight", 0), ("encoder.layers.encoder_layer_0.ln_1.weight", 0),
            ("encoder.layers.encoder_layer_1.mlp.3.weight", 0)} <= members(residual)
    result = prune(target, specs, kwargs=kwargs, ratio=0.3, path=str(tmp_path / "vit.pt2"))
    assert [left["id"] for left in result.left_out] == [0]
    assert "MultiheadAttention" in result.left_out[0]["why"]
    assert sorted(r["producers"] for r in result.groups) == [[f"encoder.layers.encoder_layer_{i}.mlp.0"] for i in (0, 1)]
    assert all(r["channels"] == 768 and r["kept"] == 544 for r in result.groups)  # 537.6 up to 544
    keys = ("params", "flops", "mac_bytes", "kernels")
    assert {k: result.after[k] for k in keys} == {k: result.predicted[k] for k in keys}
    assert result.after["params"] < result.before["params"]


# --- 7. the scan's recommendation is what prune then does -----------------------------------------

def test_scan_prune_recommendation_matches_prune():
    report = archscan.scan("zoo:resnet18", INPUTS["resnet18"], name="zoo:resnet18")
    recs = [r for r in report.recommendations if r.kind == "prune"]
    assert recs
    rec = recs[0]
    argv = shlex.split(rec.apply)
    assert argv[:3] == ["archscan", "prune", "zoo:resnet18"]
    gid, ratio = int(argv[argv.index("--group") + 1]), float(argv[argv.index("--ratio") + 1])
    assert ratio == 0.3
    result = prune(to_target("zoo:resnet18"), input_specs(INPUTS["resnet18"]), ratio=ratio, group_ids=[gid])
    for key in ("params", "flops", "mac_bytes", "kernels"):
        assert result.before[key] - result.after[key] == rec.estimated_saving[key], key



class _Scaled(nn.Module):
    """A block whose own parameter (fx reads it with get_attr, not as a call) is cut with its convs."""

    def __init__(self, c: int = 32):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, c, 3, padding=1), nn.Conv2d(c, 16, 1)
        self.scale = nn.Parameter(torch.ones(c))
        self.width = c  # a Python int fx bakes into the graph: a cut leaves it, a trace again too

    def forward(self, x):
        y = self.conv1(x) * self.scale.view(1, -1, 1, 1)
        return self.conv2(torch.relu(y)).flatten(1)[:, : self.width]


@pytest.mark.parametrize("model", ["zoo:resnet18", "zoo:mobilenet_v2", "zoo:vit_b_16", "scaled"])
def test_cut_copies_run_the_scans_graph_as_a_trace_of_them_would(model):
    """The recommendation counts each cut copy on the uncut model's fx graph (no trace): every cut's
    totals equal those of the copy traced again."""
    from archscan.analysis import analysis
    from archscan.prune import params_removed, predict

    target = to_target(_Scaled() if model == "scaled" else model)
    specs = input_specs("1,3,224,224" if "vit" in model else "1,3,32,32")
    found = analysis(target, specs, memory=False)
    assert found.captured.kind == "fx"
    gs = analyse(target, specs, model=found.captured.model)
    cuts = plan(gs, 0.3)
    cuts.sort(key=lambda c: -params_removed(c[0], len(c[1]), gs.param_shapes, gs.buffers))
    compared = 0
    for cut in cuts[:4]:
        try:
            traced = predict(target, specs, [cut], model=found.captured.model, quick=True)
        except ArchscanError:
            with pytest.raises(ArchscanError):
                predict(target, specs, [cut], model=found.captured.model, quick=True, graph=found.captured.gm.graph)
            continue
        assert predict(target, specs, [cut], model=found.captured.model, quick=True,
                       graph=found.captured.gm.graph) == traced
        compared += 1
    assert compared >= 1
    if model == "scaled":  # the block's own parameter was among the cuts
        assert any("scale" in m.param for c, _ in cuts for m in c.members)

def test_python_prune_recommendation_is_runnable():
    model = zoo.create_model("resnet18").eval()
    report = archscan.scan(model, INPUTS["resnet18"])
    rec = next(r for r in report.recommendations if r.kind == "prune")
    assert rec.apply.startswith("from archscan.prune import prune; prune(model, inputs, group_ids=[")
    scope = {"model": model, "inputs": [INPUTS["resnet18"]]}
    with tempfile.TemporaryDirectory() as tmp:
        exec(rec.apply.replace("'model-pruned.pt2'", repr(os.path.join(tmp, "m.pt2"))), scope)
        assert os.path.isfile(os.path.join(tmp, "m.pt2"))


# --- 8. scale ---------------------------------------------------------------------------------------

def test_llama3_70b_grouping_is_fast_and_small():
    code = ("import json, resource, time; t = time.perf_counter(); "
            "from archscan.load.targets import input_specs, to_target; from archscan.prune import analyse; "
            "g = analyse(to_target('zoo:llama3_70b'), input_specs('1,2048:int64')); "
            "print(json.dumps({'seconds': time.perf_counter() - t, 'groups': len(g.groups), "
            f"'peak_kib': {PEAK_KIB}}}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["seconds"] < 30, data
    assert data["peak_kib"] < 2 * 1024 * 1024, data
    assert data["groups"] > 80 * 2  # per layer at least v->o and gate/up->down


@pytest.mark.parametrize("n", [0, 1, 2, 7, 300])
@pytest.mark.parametrize("high", [1, 3, 1 << 62])
def test_unique_helpers_match_numpy(n, high):
    from archscan.prune.groups import unique, unique_rows

    rng = np.random.default_rng(n * 7 + high % 97)
    values = rng.integers(0, high, size=n)
    assert np.array_equal(unique(values), np.unique(values))
    rows = rng.integers(0, high, size=(n, 2))
    count, rank = unique_rows(rows)
    expected, inverse = np.unique(rows, axis=0, return_inverse=True)
    assert count == len(expected)
    assert np.array_equal(rank, np.ravel(inverse))


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_a_cut_copy_runs_only_the_nodes_its_cut_reaches(name, monkeypatch):
    """The prune recommendation's cut copies reuse the scan's own costs for every node that reads
    what it read in the scan's run and holds the weights it held: the same savings as copies run
    whole, from a few of the graph's nodes."""
    import weakref

    from archscan import capture as C

    runs = []
    init = C._ReusingInterpreter.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        runs.append(self)

    monkeypatch.setattr(C._ReusingInterpreter, "__init__", spy)
    shape = [(1, 3, 224, 224)]
    reused = [(r.target, r.estimated_saving) for r in archscan.scan(f"zoo:{name}", shape).recommendations
              if r.kind == "prune"]
    assert reused and runs
    for interp in runs:
        nodes = len(interp.module.graph.nodes)
        assert len(interp.same) > nodes // 2, (len(interp.same), nodes)
    monkeypatch.setattr(C, "_PRIORS", weakref.WeakKeyDictionary())
    monkeypatch.setattr(C._PRIORS.__class__, "__setitem__", lambda self, key, value: None)
    whole = [(r.target, r.estimated_saving) for r in archscan.scan(f"zoo:{name}", shape).recommendations
             if r.kind == "prune"]
    assert reused == whole
