"""Ops that had no formula: recurrent layers' backward, the backward kernels of norms, pooling,
activations, losses and sampling, complex multiply-adds and FFTs, spatial transformers and
scatter-style aggregation.

Convention: FLOPs = multiply-adds, real ones (a complex multiply-add is 4). torch.utils.flop_counter
(FlopCounterMode) counts 2 FLOPs per multiply-add: every comparison divides its total by 2. Where
FlopCounterMode has no formula for an op (oneDNN's LSTM, FFTs, mv, the affine grid), the test
compares with a hand formula whose arithmetic is in a comment. Element ops and bytes are checked
as exact integers on tiny shapes (float32: 4 bytes, int64: 8 bytes).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import archscan
from archscan import zoo
from archscan.costs import cost_op
from archscan.costs.registry import _CATEGORY, fft_multiply_adds
from archscan.memory.train import TrainOptions


class Costs(TorchDispatchMode):
    """Every aten op run under it, costed by archscan (``cost_op``) on real tensors."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append(cost_op(func, args, kwargs, out))
        return out

    def named(self, op: str):
        """The one cost of ``op`` ('aten.mm.default')."""
        (found,) = [c for c in self.ops if c.op == op]
        return found

    def flops(self, op: str) -> list[int]:
        """The multiply-adds of every run of ``op``, in order."""
        return [c.flops for c in self.ops if c.op == op]

    def uncounted(self) -> list[str]:
        return [c.op for c in self.ops if not c.counted]


def torch_macs(model, *inputs, mkldnn: bool = True) -> tuple[int, int]:
    """FlopCounterMode's (forward, backward) of ``model(*inputs)`` and a sum loss, halved: multiply-adds."""
    with torch.backends.mkldnn.flags(enabled=mkldnn):
        with FlopCounterMode(display=False) as forward:
            out = model(*inputs)
        with FlopCounterMode(display=False) as backward:
            out.float().sum().backward()
    return forward.get_total_flops() // 2, backward.get_total_flops() // 2


def step(model, *shapes):
    """archscan's training step of ``model`` on inputs of ``shapes``: the report's ``training_step``."""
    report = archscan.scan(model, list(shapes), train=True, rules=[], recommend=False, profile=False)
    return report.training_step


# --- recurrent layers' backward ----------------------------------------------------------------------


class LstmEveryGradient(nn.Module):
    """Linear -> LSTM with learned initial states -> head on the last step: the LSTM's input and
    initial states need gradients, so torch's decomposed LSTM computes every gradient that
    oneDNN's kernel computes."""

    def __init__(self, layers: int = 2, bidirectional: bool = False):
        super().__init__()
        directions = 2 if bidirectional else 1
        self.proj = nn.Linear(8, 16)
        self.rnn = nn.LSTM(16, 32, layers, batch_first=True, bidirectional=bidirectional)
        self.h0 = nn.Parameter(torch.zeros(layers * directions, 1, 32))
        self.c0 = nn.Parameter(torch.zeros(layers * directions, 1, 32))
        self.head = nn.Linear(32 * directions, 4)

    def forward(self, x):
        b = x.shape[0]
        states = (self.h0.expand(-1, b, -1).contiguous(), self.c0.expand(-1, b, -1).contiguous())
        y, _ = self.rnn(self.proj(x), states)
        return self.head(y[:, -1])


@pytest.mark.parametrize("layers,bidirectional", [(2, False), (1, True)])
def test_lstm_backward_matches_flop_counter_on_the_decomposed_lstm(layers, bidirectional):
    """The training step runs oneDNN's LSTM (``mkldnn_rnn_layer`` and ``mkldnn_rnn_layer_backward``),
    which FlopCounterMode does not count; with oneDNN off, torch runs the same LSTM as mm/addmm,
    which it does. With every gradient needed, both count the same multiply-adds, exactly."""
    torch.manual_seed(0)
    model = LstmEveryGradient(layers, bidirectional)
    forward, backward = torch_macs(model, torch.randn(3, 5, 8), mkldnn=False)
    got = step(model, (3, 5, 8))
    assert got["uncounted"] == {}
    assert got["phases"]["forward"]["flops"] == forward
    assert got["phases"]["backward"]["flops"] == backward
    # by hand, 2 layers: tokens 15; proj 15*8*16, layer 0 15*4*32*(16+32), layer 1 15*4*32*(32+32), head 3*32*4
    if layers == 2:
        assert forward == 1_920 + 92_160 + 122_880 + 384
        assert backward == 2 * forward - 1_920  # the proj's input (the model's input) needs no gradient


def test_lstm_backward_counts_what_onednn_computes():
    """A plain LSTM on the model's input: oneDNN's backward (``mkldnn_rnn_layer_backward``, no output
    mask in its schema) computes the input and initial-state gradients whether or not anything needs
    them, and archscan counts that kernel: twice the forward. torch's decomposed LSTM skips the
    first layer's input gradient and the zero initial states' gradients, so FlopCounterMode (on the
    decomposed run) counts less. archscan is right about what the oneDNN kernel runs; the difference
    is exactly those gradients."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(32, 64, 2, batch_first=True)
            self.head = nn.Linear(64, 10)

        def forward(self, x):
            return self.head(self.rnn(x)[0][:, -1])

    torch.manual_seed(0)
    net = Net()
    forward, backward = torch_macs(net, torch.randn(4, 16, 32), mkldnn=False)
    got = step(net, (4, 16, 32))
    # forward: 64 tokens * (256*32 + 256*64) + 64 tokens * (256*64 + 256*64) + head 4*64*10
    #        = 1_572_864 + 2_097_152 + 2_560 = 3_672_576
    assert got["phases"]["forward"]["flops"] == forward == 3_672_576
    # archscan: twice the forward (LSTM and head); before it counted the head's 5_120 alone
    assert got["phases"]["backward"]["flops"] == 2 * 3_672_576 == 7_345_152
    # what the decomposed run skips: layer 0's input gradient 64*256*32 = 524_288 and the initial
    # hidden states' gradients 4*256*64 = 65_536 per layer, 131_072 for 2
    assert backward == 7_345_152 - 524_288 - 131_072 == 6_689_792
    assert got["uncounted"] == {}


@pytest.mark.parametrize("kind", [nn.GRU, nn.RNN])
def test_gru_and_rnn_backward_match_flop_counter(kind):
    """On the CPU torch runs GRU and RNN as their cells' mm/addmm, forward and backward:
    archscan's step counts what FlopCounterMode counts, and nothing is uncounted."""
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = kind(16, 32, 2, batch_first=True)
            self.head = nn.Linear(32, 4)

        def forward(self, x):
            return self.head(self.rnn(x)[0][:, -1])

    net = Net()
    forward, backward = torch_macs(net, torch.randn(3, 5, 16))
    got = step(net, (3, 5, 16))
    assert got["uncounted"] == {}
    assert (got["phases"]["forward"]["flops"], got["phases"]["backward"]["flops"]) == (forward, backward)
    assert backward > 0


@pytest.mark.parametrize("mask,factor", [((True, True, True, True), 2), ((True, True, True, False), 1)])
def test_cudnn_rnn_backward(mask, factor):
    """cuDNN's RNN backward: the data gradient always (torch runs it unconditionally), the weight
    gradient when output_mask[3] asks. Costed from shapes (no GPU here): an LSTM 16 -> 32, 2 layers,
    input [t=5, b=3, 16]."""
    e = torch.empty
    weights = [e(128, 16), e(128, 32), e(128), e(128), e(128, 32), e(128, 32), e(128), e(128)]
    x, hx, cx, y = e(5, 3, 16), e(2, 3, 32), e(2, 3, 32), e(5, 3, 32)
    args = (x, weights, 4, e(0), hx, cx, y, e(5, 3, 32), None, None, 2, 32, 0, 2, False, 0.0, True, False, [],
            None, e(0), list(mask))
    out = (e(5, 3, 16), e(2, 3, 32), e(2, 3, 32), [e(w.shape) for w in weights] if mask[3] else [])
    cost = cost_op(torch.ops.aten._cudnn_rnn_backward.default, args, {}, out)
    # forward: 15 tokens * (128*16 + 128*32 + 128*32 + 128*32) = 15 * 14_336 = 215_040
    assert cost.flops == factor * 215_040 and cost.category == "rnn" and cost.counted


def test_fused_rnn_cells_count_their_gates():
    """The GPU's fused LSTM/GRU cell kernels (the pointwise tail after the gates' GEMMs) and their
    backward: one element op per gate element. Costed from shapes: batch 2, hidden 8."""
    e = torch.empty
    lstm = cost_op(torch.ops.aten._thnn_fused_lstm_cell.default, (e(2, 32), e(2, 32), e(2, 8)), {},
                   (e(2, 8), e(2, 8), e(2, 32)))
    lstm_back = cost_op(torch.ops.aten._thnn_fused_lstm_cell_backward_impl.default,
                        (e(2, 8), e(2, 8), e(2, 8), e(2, 8), e(2, 32), True), {}, (e(2, 32), e(2, 8), e(32)))
    gru = cost_op(torch.ops.aten._thnn_fused_gru_cell.default, (e(2, 24), e(2, 24), e(2, 8)), {},
                  (e(2, 8), e(2, 40)))
    gru_back = cost_op(torch.ops.aten._thnn_fused_gru_cell_backward.default, (e(2, 8), e(2, 40), True), {},
                       (e(2, 24), e(2, 24), e(2, 8), e(24), e(24)))
    # gates: 2 * 4*8 = 64 (LSTM), 2 * 3*8 = 48 (GRU)
    assert [(c.elem_ops, c.category, c.counted) for c in (lstm, lstm_back, gru, gru_back)] == \
        [(64, "rnn", True), (64, "rnn", True), (48, "rnn", True), (48, "rnn", True)]


# --- zoo models: nothing of the step is uncounted ------------------------------------------------------


@pytest.mark.parametrize("name,shape,recompute", [
    ("resnet18", (1, 3, 64, 64), 0),
    # 12 blocks, 197 tokens, 3 heads of 64: Q K^T recomputed, 12 * 197*197 * 192 = 89_415_936
    ("vit_tiny", (1, 3, 224, 224), 89_415_936),
])
def test_zoo_steps_count_every_op_and_match_flop_counter(name, shape, recompute):
    """ResNet-18 (batch norm, max pooling backward) and ViT (layer norm, softmax backward): every op
    of the step has a formula, and the multiply-adds are FlopCounterMode's (its conv and mm backward
    formulas; the norms' and pooling's backward do no multiply-adds), run with the math attention
    (bmm, which it counts). The step's CPU attention backward recomputes the scores Q K^T, as the
    fused kernels do and as torch.utils.flop_counter counts their backward; the math backward keeps
    them instead. Both are right about their own kernels: the difference is that recompute, exactly."""
    torch.manual_seed(0)
    model = zoo.create_model(name)
    with sdpa_kernel(SDPBackend.MATH):
        forward, backward = torch_macs(model, torch.randn(shape))
    got = step(model, shape)
    assert got["uncounted"] == {}
    assert got["phases"]["forward"]["flops"] == forward
    assert got["phases"]["backward"]["flops"] == backward + recompute


def test_llama_step_with_cross_entropy_counts_every_op():
    """The zoo's Llama under the cross-entropy loss a user's loop computes: the loss (log-softmax,
    NLL) and its gradient are counted too."""
    report = archscan.scan("zoo:llama_tiny", ["1,32:int64"], train=TrainOptions(loss="cross-entropy"), rules=[],
                           recommend=False, profile=False)
    assert report.training_step["uncounted"] == {}


# --- backward kernels without multiply-adds: element ops by hand ------------------------------------------


def _run(model, *inputs, loss=None):
    with Costs() as costs:
        out = model(*inputs)
        (loss(out) if loss else out.sum()).backward()
    assert costs.uncounted() == []
    return costs


@pytest.mark.parametrize("layer,shape,op,elem", [
    (nn.LayerNorm(16), (4, 16), "native_layer_norm_backward", 64),          # 4*16 normalized elements
    (nn.BatchNorm2d(4), (2, 4, 3, 3), "native_batch_norm_backward", 72),    # 2*4*3*3
    (nn.GroupNorm(2, 4), (2, 4, 3, 3), "native_group_norm_backward", 72),
    (nn.MaxPool2d(2), (1, 2, 4, 4), "max_pool2d_with_indices_backward", 8),  # 8 outputs, one input each
    (nn.AvgPool2d(2), (1, 2, 4, 4), "avg_pool2d_backward", 32),              # 8 outputs * 2*2 window
    (nn.AdaptiveAvgPool2d(2), (1, 2, 4, 4), "_adaptive_avg_pool2d_backward", 32),  # 32 inputs
    (nn.Upsample(scale_factor=2, mode="bilinear"), (1, 2, 4, 4), "upsample_bilinear2d_backward", 512),  # 128 * 4 taps
    (nn.Upsample(scale_factor=2), (1, 2, 4, 4), "upsample_nearest2d_backward", 128),  # 128 * 1
    (nn.Softmax(-1), (4, 5), "_softmax_backward_data", 20),
    (nn.Hardswish(), (4, 5), "hardswish_backward", 20),
])
def test_backward_elem_ops(layer, shape, op, elem):
    x = torch.randn(shape, requires_grad=True)
    cost = _run(layer, x).named(f"aten.{op}.default")
    assert (cost.flops, cost.elem_ops, cost.counted) == (0, elem, True)
    assert cost.mac_bytes > 0


def test_norm_backward_bytes():
    # native_layer_norm_backward on [4, 16]: reads dy 64, x 64, mean 4, rstd 4, weight 16, bias 16;
    # writes dx 64, dweight 16, dbias 16: 264 elements * 4 bytes = 1056
    cost = _run(nn.LayerNorm(16), torch.randn(4, 16, requires_grad=True)).named("aten.native_layer_norm_backward.default")
    assert cost.mac_bytes == 1_056 and cost.category == "norm"


def test_grid_sample_backward_counts_both_gradients():
    # grid [1, 3, 3, 2] -> 18 outputs [1, 2, 3, 3], bilinear 4 taps: forward 72; backward, input and
    # grid gradients, 2 * 72 = 144
    x = torch.randn(1, 2, 4, 4, requires_grad=True)
    grid = (torch.rand(1, 3, 3, 2) * 2 - 1).requires_grad_()
    costs = _run(lambda a, g: F.grid_sample(a, g, align_corners=False), x, grid)
    assert costs.named("aten.grid_sampler_2d.default").elem_ops == 72
    assert costs.named("aten.grid_sampler_2d_backward.default").elem_ops == 144


def test_embedding_bag_backward():
    # EmbeddingBag(10, 8), 2 bags of 5: 10 indices * 8 features added + the 10*8 table zeroed = 160
    bag = nn.EmbeddingBag(10, 8, mode="sum")
    cost = _run(bag, torch.randint(0, 10, (2, 5))).named("aten._embedding_bag_backward.default")
    assert (cost.elem_ops, cost.category) == (160, "embedding")


def test_cross_entropy_loss_and_its_gradient():
    # cross_entropy on logits [4, 5], 4 targets: log_softmax 20, NLL one per target 4; backward NLL 4,
    # log_softmax's 20
    logits = torch.randn(4, 5, requires_grad=True)
    costs = _run(lambda z: z, logits, loss=lambda z: F.cross_entropy(z, torch.tensor([0, 1, 2, 3])))
    assert [(costs.named(f"aten.{op}.default").elem_ops, costs.named(f"aten.{op}.default").category) for op in
            ("nll_loss_forward", "nll_loss_backward", "_log_softmax_backward_data")] == \
        [(4, "reduction"), (4, "elementwise"), (20, "activation")]


@pytest.mark.parametrize("loss,op", [(F.mse_loss, "mse_loss"), (F.smooth_l1_loss, "smooth_l1_loss"),
                                     (F.huber_loss, "huber_loss"), (F.soft_margin_loss, "soft_margin_loss")])
def test_regression_losses(loss, op):
    # [3, 4] against a target: the loss reads 12 elements (a reduction), its gradient writes 12
    y = torch.randn(3, 4, requires_grad=True)
    costs = _run(lambda a: a, y, loss=lambda a: loss(a, torch.ones(3, 4)))
    assert (costs.named(f"aten.{op}.default").elem_ops, costs.named(f"aten.{op}_backward.default").elem_ops) == (12, 12)


# --- complex multiply-adds and FFTs -------------------------------------------------------------------------


def test_complex_matmul_counts_four_real_multiply_adds():
    """A complex multiply-add is 4 real ones ((a+bi)(c+di) = ac-bd + (ad+bc)i). FlopCounterMode
    counts a complex mm by its shapes as if it were real: archscan's count is 4 times its
    (halved) count, and archscan is right in real multiply-adds. The backward's two mm are complex too."""
    a = torch.randn(3, 4, dtype=torch.cfloat, requires_grad=True)
    b = torch.randn(4, 5, dtype=torch.cfloat, requires_grad=True)
    forward, backward = torch_macs(lambda x, y: (x @ y).abs(), a, b)
    costs = _run(lambda x, y: (x @ y).abs(), a, b)
    mms = costs.flops("aten.mm.default")
    # forward 3*4*5 = 60 complex multiply-adds = 240 real; backward dA [3,5]x[5,4], dB [4,3]x[3,5]: 2 * 240
    assert mms == [240, 240, 240]
    assert (forward, backward) == (60, 120)


def test_complex_einsum_through_scan():
    """A spectral layer's complex einsum (bmm): 4 real multiply-adds per complex one."""
    class Mix(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, 4, 5, dtype=torch.cfloat))

        def forward(self, x):
            return torch.einsum("bix,iox->box", x.to(torch.cfloat), self.w)

    r = archscan.scan(Mix(), [(2, 3, 5)], rules=[], recommend=False, profile=False)
    # per frequency x (5): b*i*o = 2*3*4 = 24 complex multiply-adds, 120 in all, 480 real
    assert r.totals.flops == 480 and r.uncounted == {}


def test_complex_convolution_counts_what_torch_runs():
    """torch runs a complex convolution as three real convolutions (Gauss's trick in conv2d), which
    is what reaches the registry and FlopCounterMode alike: both count 3 real multiply-adds per
    complex one. They agree; 4 would count a product torch does not compute."""
    x = torch.randn(1, 3, 6, 6, dtype=torch.cfloat)
    w = torch.randn(4, 3, 3, 3, dtype=torch.cfloat)
    forward, _ = torch_macs(lambda a, b: F.conv2d(a, b).abs(), x.requires_grad_(), w.requires_grad_())
    costs = _run(lambda a, b: F.conv2d(a, b).abs(), x, w)
    convs = costs.flops("aten.convolution.default")
    # one real conv: 4*4 outputs * 4 channels * 3*3*3 = 1_728; three of them
    assert convs == [1_728] * 3 and forward == 3 * 1_728


@pytest.mark.parametrize("sizes,transforms,real,macs", [
    ((8,), 1, False, 60),        # 5*8*3 = 120 flops -> 60
    ((8,), 3, True, 90),         # real: 5*8*3/2 = 60 flops -> 30 each
    ((4, 4), 2, False, 320),     # N = 16: 5*16*4 = 320 flops -> 160 each
    ((1,), 5, False, 0),         # a 1-point transform is the identity
])
def test_fft_multiply_adds(sizes, transforms, real, macs):
    assert fft_multiply_adds(sizes, transforms, real) == macs


def test_fft_ops_by_hand():
    """FlopCounterMode has no FFT formula (it counts 0); archscan counts benchFFT's 5 N log2 N real
    flops per complex transform (half for a real one) as multiply-adds (/2), for the FFT and its
    backward (itself FFTs)."""
    x = torch.randn(2, 16, requires_grad=True)
    forward, backward = torch_macs(lambda a: torch.fft.irfft(torch.fft.rfft(a), n=16) + torch.fft.fft(a).abs(), x)
    assert (forward, backward) == (0, 0)
    costs = _run(lambda a: torch.fft.irfft(torch.fft.rfft(a), n=16) + torch.fft.fft(a).abs(), x)
    flops = {op: costs.flops(f"aten.{op}.default") for op in ("_fft_r2c", "_fft_c2r", "_fft_c2c")}
    # N = 16, log2 N = 4, 2 rows: complex 2 * 5*16*4/2 = 320; real 160. Forward: rfft (r2c), irfft (c2r),
    # fft of a real tensor (r2c, two-sided). Backward: fft's gradient is a c2c, irfft's an r2c, rfft's a c2c.
    assert flops == {"_fft_r2c": [160, 160, 160], "_fft_c2r": [160], "_fft_c2c": [320, 320]}
    r = archscan.scan(_Spectral(), [(2, 16)], rules=[], recommend=False, profile=False)
    assert r.totals.flops == 160 + 160 and r.uncounted == {}


class _Spectral(nn.Module):
    def forward(self, x):
        return torch.fft.irfft(torch.fft.rfft(x), n=16)


# --- spatial transformers and scatter-style aggregation -------------------------------------------------


class SpatialTransformer(nn.Module):
    """Jaderberg et al. (NeurIPS 2015): a localization net predicts theta, F.affine_grid makes the
    sampling grid, F.grid_sample resamples the input."""

    def __init__(self):
        super().__init__()
        self.loc = nn.Linear(3 * 8 * 8, 6)
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        theta = self.loc(x.flatten(1)).view(-1, 2, 3)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return self.conv(F.grid_sample(x, grid, align_corners=False))


def test_spatial_transformer_forward():
    # affine_grid: 2 images * 8*8 points * theta 2*3 = 768 multiply-adds; loc 2*192*6 = 2_304;
    # conv 2 * 6*6 * 4 * 3*3*3 = 7_776. grid_sample: 2*3*8*8 outputs * 4 taps = 1_536 element ops
    r = archscan.scan(SpatialTransformer(), [(2, 3, 8, 8)], rules=[], recommend=False, profile=False)
    assert r.uncounted == {}
    grid = [n for n in r.nodes if "affine_grid_generator" in " ".join(n.aten_ops)]
    assert [(n.flops, n.category) for n in grid] == [(768, "matmul")]
    assert r.totals.flops == 768 + 2_304 + 7_776


def test_spatial_transformer_step_against_flop_counter():
    """FlopCounterMode sees ``affine_grid_generator`` whole and counts 0 for it (its bmm runs inside
    the kernel), while its backward decomposes into a bmm it counts: archscan's forward is torch's
    plus the affine grid's 768, and the backwards agree exactly. archscan is right: the forward's
    bmm runs."""
    torch.manual_seed(0)
    model = SpatialTransformer()
    forward, backward = torch_macs(model, torch.randn(2, 3, 8, 8))
    got = step(model, (2, 3, 8, 8))
    assert got["uncounted"] == {}
    assert got["phases"]["forward"]["flops"] == forward + 768
    assert got["phases"]["backward"]["flops"] == backward


def test_scatter_style_aggregation():
    # 6 nodes, 5 edges, 3 features: each op combines 5*3 = 15 source elements. index_add's bytes:
    # read self 6*3*4 = 72, index 5*8 = 40, source 5*3*4 = 60; write 72: 244
    x = torch.randn(6, 3, requires_grad=True)
    dst = torch.tensor([0, 1, 1, 4, 5])
    index = dst[:, None].expand(-1, 3)

    def aggregate(h):
        m = h[:5]
        zero = torch.zeros(6, 3)
        return (zero.index_add(0, dst, m) + zero.scatter_add(0, index, m)
                + zero.scatter_reduce(0, index, m, reduce="amax") + zero.clone().index_add_(0, dst, m))

    costs = _run(aggregate, x)
    for op in ("aten.index_add.default", "aten.scatter_add.default", "aten.scatter_reduce.two", "aten.index_add_.default"):
        cost = next(c for c in costs.ops if c.op == op)  # the forward's (scatter_reduce's backward runs a scatter_add)
        assert (cost.flops, cost.elem_ops, cost.category) == (0, 15, "data_movement"), op
    assert costs.named("aten.index_add.default").mac_bytes == 244


def test_matrix_vector_and_dot_products():
    """torch.matmul with a 1-d operand runs mv or dot, which FlopCounterMode does not count (0);
    archscan counts one multiply-add per matrix (vector) element."""
    m = torch.randn(5, 4, requires_grad=True)
    v = torch.randn(4, requires_grad=True)
    forward, _ = torch_macs(lambda a, b: (a @ b).sum() + b @ b, m, v)
    costs = _run(lambda a, b: (a @ b).sum() + b @ b, m, v)
    assert forward == 0
    assert costs.flops("aten.mv.default") == [20, 20]  # m v, and v's gradient m^T g: 5*4 each
    assert costs.flops("aten.dot.default") == [4]      # v . v


def test_float8_scaled_mm_reuses_torch_formula():
    """``_scaled_mm`` (float8 GEMMs) reuses torch.utils.flop_counter's formula, halved: [16, 32] x [32, 8]."""
    e = torch.empty
    a, b = e(16, 32, dtype=torch.float8_e4m3fn), e(8, 32, dtype=torch.float8_e4m3fn).t()
    out = e(16, 8, dtype=torch.bfloat16)
    cost = cost_op(torch.ops.aten._scaled_mm.default, (a, b, e(()), e(())), {"out_dtype": torch.bfloat16}, out)
    assert (cost.flops, cost.category) == (16 * 32 * 8, "matmul")


def test_category_names_are_ops_this_torch_has():
    """A misspelt name in the category table would silently never match."""
    for key in _CATEGORY:
        namespace, name = key.split("::")
        if namespace == "aten":
            assert hasattr(torch.ops.aten, name), key
