"""Exact integers on tiny shapes, with the arithmetic in a comment.

Convention: FLOPs = multiply-adds; MAC = bytes read (distinct tensors, weights included) +
bytes written, float32 = 4 bytes per element unless stated.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import archscan
from archscan.costs import cost_op
from archscan.costs.registry import (_ELEM_FORMULAS, _FLOP_FORMULAS, deform_conv2d_flops, grid_sampler_elem_ops,
                                     interpolation_elem_ops, nms_elem_ops, roi_align_elem_ops)


class Single(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)


def only_node(report):
    (node,) = [n for n in report.nodes if n.category != "view"]
    return node


# ShuffleNetV2 Table 1 (G1): 1x1 conv c1 -> c2 at 56x56, MAC = hw(c1 + c2) + c1*c2 elements.
@pytest.mark.parametrize("c1,c2,mac_elems", [
    (128, 128, 819_200),    # 3136*(128+128) + 128*128 = 802816 + 16384
    (90, 180, 862_920),     # 3136*270 + 16200
    (52, 312, 1_157_728),   # 3136*364 + 16224
    (36, 432, 1_483_200),   # 3136*468 + 15552
])
def test_table1_pointwise_conv_mac(c1, c2, mac_elems):
    r = archscan.scan(Single(nn.Conv2d(c1, c2, 1, bias=False)), [(1, c1, 56, 56)])
    node = only_node(r)
    assert node.mac_bytes == 4 * mac_elems
    assert node.flops == 56 * 56 * c1 * c2   # B = hw c1 c2
    assert node.weight_bytes == 4 * c1 * c2
    assert node.category == "conv"


# ShuffleNetV2 Table 2 (G2): group conv c -> c, MAC = hw(2c) + c^2/g elements (Eq. 2).
@pytest.mark.parametrize("c,g,mac_elems", [
    (128, 1, 819_200),     # 3136*256 + 16384
    (180, 2, 1_145_160),   # 3136*360 + 32400/2
    (256, 4, 1_622_016),   # 3136*512 + 65536/4
    (360, 8, 2_274_120),   # 3136*720 + 129600/8
])
def test_table2_group_conv_mac(c, g, mac_elems):
    r = archscan.scan(Single(nn.Conv2d(c, c, 1, groups=g, bias=False)), [(1, c, 56, 56)])
    node = only_node(r)
    assert node.mac_bytes == 4 * mac_elems
    assert node.flops == 3136 * c * c // g
    assert node.category == ("conv" if g == 1 else "grouped_conv")
    assert node.attrs["groups"] == g


def test_depthwise_conv():
    # 3x3 depthwise, 32 ch, 10x10, pad 1: FLOPs = 100*32*9 = 28800
    # MAC = in 3200 + weight 288 + bias 32 + out 3200 = 6720 elements
    r = archscan.scan(Single(nn.Conv2d(32, 32, 3, padding=1, groups=32)), [(1, 32, 10, 10)])
    node = only_node(r)
    assert (node.flops, node.mac_bytes, node.category) == (28_800, 4 * 6_720, "depthwise_conv")


def test_linear_addmm():
    # [n, p] = addmm([n, m], [m, p]) with n=4, m=16, p=8: FLOPs 4*16*8 = 512
    # MAC = x 64 + W 128 + b 8 + y 32 = 232 elements
    r = archscan.scan(Single(nn.Linear(16, 8)), [(4, 16)])
    node = only_node(r)
    assert (node.flops, node.mac_bytes, node.params, node.category) == (512, 4 * 232, 136, "linear")


def test_bfloat16_halves_bytes_not_flops():
    r32 = archscan.scan(Single(nn.Linear(16, 8)), [(4, 16)])
    r16 = archscan.scan(Single(nn.Linear(16, 8)), [(4, 16)], dtype="bfloat16")
    assert r16.totals.flops == r32.totals.flops == 512
    assert r16.totals.mac_bytes == 2 * 232
    assert r16.dtype == "bfloat16"


def test_matmul_bmm():
    class BMM(nn.Module):
        def forward(self, a, b):
            return torch.bmm(a, b)

    # [2, 3, 5] = bmm([2, 3, 4], [2, 4, 5]): 2*3*4*5 = 120 multiply-adds
    # MAC = 24 + 40 + 30 = 94 elements
    r = archscan.scan(BMM(), [(2, 3, 4), (2, 4, 5)])
    node = only_node(r)
    assert (node.flops, node.mac_bytes, node.category) == (120, 4 * 94, "matmul")


def test_sdpa_is_counted_on_cpu():
    class Attn(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v)

    # q, k, v [b=2, h=4, l=10, e=16]: QK^T 2*4*10*10*16 + AV 2*4*10*10*16 = 25600
    r = archscan.scan(Attn(), [(2, 4, 10, 16)] * 3)
    assert r.totals.flops == 25_600
    assert any(n.category == "attention" for n in r.nodes)


def test_multihead_attention_fused_path():
    # x [b=2, l=10, e=64]: in-proj 3*2*10*64*64 = 245760, QK^T + AV 2*2*10*10*64 = 25600,
    # out-proj 2*10*64*64 = 81920 -> 353280
    from toy import SelfAttention  # nn.MultiheadAttention(64, 4, batch_first=True), self-attention

    r = archscan.scan(SelfAttention(64, 4), [(2, 10, 64)])
    assert r.totals.flops == 353_280
    assert r.node("attn").category == "attention"


def test_views_move_nothing():
    class V(nn.Module):
        def forward(self, x):
            return x.view(4, 4).t().unsqueeze(0)

    r = archscan.scan(V(), [(16,)])
    assert r.totals.mac_bytes == 0 and r.totals.flops == 0
    assert {n.category for n in r.nodes} == {"view"}


def test_elementwise_add_and_relu():
    class E(nn.Module):
        def forward(self, x, y):
            return torch.relu(x + y)

    # add: read 2*12, write 12 -> 36 elements; relu: read 12, write 12 -> 24; elem ops 12 + 12
    r = archscan.scan(E(), [(3, 4), (3, 4)])
    assert r.totals.mac_bytes == 4 * 60
    assert r.totals.elem_ops == 24
    assert r.totals.flops == 0
    assert [n.category for n in r.nodes] == ["elementwise", "activation"]


def test_same_tensor_read_once():
    class Sq(nn.Module):
        def forward(self, x):
            return x * x

    r = archscan.scan(Sq(), [(10,)])
    assert r.totals.mac_bytes == 4 * (10 + 10)


def test_embedding_reads_rows_not_table():
    # ids [1, 12] int64 -> [1, 12, 16]: read 12*8 index bytes + 12*16*4 row bytes, write 12*16*4
    r = archscan.scan(Single(nn.Embedding(1000, 16)), ["1,12:int64"])
    node = only_node(r)
    assert node.mac_bytes == 12 * 8 + 2 * 12 * 16 * 4
    assert node.params == 16_000 and node.flops == 0 and node.category == "embedding"


def test_maxpool_element_ops():
    # 3x3 stride 2 pad 1 on [1, 8, 16, 16] -> [1, 8, 8, 8]: 512 outputs * 9 window = 4608 elem ops
    r = archscan.scan(Single(nn.MaxPool2d(3, 2, 1)), [(1, 8, 16, 16)])
    node = only_node(r)
    assert node.elem_ops == 4608 and node.category == "pooling"
    assert node.out_shape == (1, 8, 8, 8)


def test_batchnorm_reads_its_four_vectors():
    # eval BN on [1, 8, 4, 4]: read 128 + 4*8 stats/affine, write 128 -> 288 elements; 8*2 params
    r = archscan.scan(Single(nn.BatchNorm2d(8)), [(1, 8, 4, 4)])
    node = only_node(r)
    assert node.mac_bytes == 4 * 288
    assert node.params == 16 and node.elem_ops == 128 and node.category == "norm"


def test_uncounted_ops_are_listed_not_zeroed():
    class Odd(nn.Module):
        def forward(self, x):
            return torch.linalg.qr(x)[0]

    r = archscan.scan(Odd(), [(4, 4)])
    assert r.uncounted, "an op without a formula must be listed"
    assert any("qr" in op for op in r.uncounted)


def test_lstm_counts_each_weight_matrix_once_per_token():
    # LSTM(16 -> 32) on [b=2, t=5, 16]: 10 tokens * (w_ih 128*16 + w_hh 128*32) = 10 * 6144 = 61440
    class Lstm(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(16, 32, batch_first=True)

        def forward(self, x):
            return self.rnn(x)[0]

    r = archscan.scan(Lstm(), [(2, 5, 16)], rules=[])
    assert r.totals.flops == 61_440 and r.uncounted == {}
    assert r.node("rnn").category == "rnn"


# --- vision ops: interpolation, grid sampling, RoI pooling, NMS, deformable convolution ---------------


@pytest.mark.parametrize("in_shape,out_shape,taps,antialias,elem", [
    ((1, 2, 4, 4), (1, 2, 8, 8), 1, False, 128),        # nearest: 1*2*8*8 outputs * 1
    ((1, 2, 4, 4), (1, 2, 8, 8), 2, False, 512),        # bilinear: 128 * 2*2
    ((1, 2, 4, 4), (1, 2, 8, 8), 4, False, 2_048),      # bicubic: 128 * 4*4
    ((1, 2, 4), (1, 2, 8), 2, False, 32),               # linear 1-d: 16 * 2
    ((1, 1, 2, 2, 2), (1, 1, 4, 4, 4), 2, False, 512),  # trilinear: 64 * 2*2*2
    ((1, 2, 4, 4), (1, 2, 2, 2), 2, True, 128),         # bilinear aa, 4 -> 2: ceil(2*4/2) = 4 per dim, 8 * 16
    ((1, 1, 8, 8), (1, 1, 2, 2), 4, True, 1_024),       # bicubic aa, 8 -> 2: ceil(4*8/2) = 16 per dim, 4 * 256
    ((1, 1, 2, 2), (1, 1, 4, 4), 4, True, 256),         # aa upscaling is plain bicubic: 16 * 16
])
def test_interpolation_elem_ops(in_shape, out_shape, taps, antialias, elem):
    assert interpolation_elem_ops(in_shape, out_shape, taps, antialias) == elem


@pytest.mark.parametrize("mode,dims,elem", [
    (0, 2, 72), (1, 2, 18), (2, 2, 288),   # 2-d, 18 outputs [1, 2, 3, 3]: bilinear 4, nearest 1, bicubic 16
    (0, 3, 144),                           # 3-d, trilinear: 18 outputs [1, 2, 1, 3, 3] * 8
])
def test_grid_sampler_elem_ops(mode, dims, elem):
    inp, grid, out = ((1, 2, 4, 4), (1, 3, 3, 2), (1, 2, 3, 3)) if dims == 2 else \
        ((1, 2, 4, 4, 4), (1, 1, 3, 3, 3), (1, 2, 1, 3, 3))
    assert grid_sampler_elem_ops(inp, grid, mode, 0, False, out_shape=out) == elem


class Resample(nn.Module):
    def forward(self, x, grid):
        up = F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=False)
        return up, F.grid_sample(x, grid, mode="bilinear", align_corners=False)


@pytest.mark.parametrize("method", ["fx", "export", "eager"])
def test_bicubic_and_grid_sample_are_counted(method):
    # bicubic 2x: [1, 2, 4, 4] -> [1, 2, 8, 8], 128 outputs * 16 taps = 2048; MAC (32 + 128) * 4 = 640
    # grid_sample bilinear: grid [1, 3, 3, 2] -> [1, 2, 3, 3], 18 * 4 = 72; MAC (32 + 18 + 18) * 4 = 272
    r = archscan.scan(Resample(), [(1, 2, 4, 4), (1, 3, 3, 2)], capture_method=method, rules=[])
    assert r.uncounted == {}
    moved = [n for n in r.nodes if n.category == "data_movement"]
    assert [(n.elem_ops, n.mac_bytes) for n in moved] == [(2_048, 640), (72, 272)]
    assert r.totals.flops == 0


@pytest.mark.parametrize("mode,shape,size,aten_op,elem", [
    ("nearest", (1, 2, 4), 8, "upsample_nearest1d", 16),                 # 2*8 outputs * 1
    ("nearest", (1, 2, 4, 4), 8, "upsample_nearest2d", 128),
    ("nearest", (1, 1, 2, 2, 2), 4, "upsample_nearest3d", 64),           # 4*4*4 * 1
    ("nearest-exact", (1, 2, 4), 8, "_upsample_nearest_exact1d", 16),
    ("nearest-exact", (1, 2, 4, 4), 8, "_upsample_nearest_exact2d", 128),
    ("nearest-exact", (1, 1, 2, 2, 2), 4, "_upsample_nearest_exact3d", 64),
    ("linear", (1, 2, 4), 8, "upsample_linear1d", 32),                   # 16 * 2
    ("bilinear", (1, 2, 4, 4), 8, "upsample_bilinear2d", 512),           # 128 * 4
    ("trilinear", (1, 1, 2, 2, 2), 4, "upsample_trilinear3d", 512),      # 64 * 8
    ("bicubic", (1, 2, 4, 4), 8, "upsample_bicubic2d", 2_048),           # 128 * 16
    ("bilinear-aa", (1, 2, 4, 4), 2, "_upsample_bilinear2d_aa", 128),    # 8 * (4*4): filter widened 2x
    ("bicubic-aa", (1, 2, 4, 4), 2, "_upsample_bicubic2d_aa", 512),      # 8 * (8*8)
])
def test_every_interpolate_mode_is_counted(mode, shape, size, aten_op, elem):
    class Up(nn.Module):
        def forward(self, x):
            m, aa = mode.removesuffix("-aa"), mode.endswith("-aa")
            return F.interpolate(x, size=size, mode=m, antialias=aa) if aa else F.interpolate(x, size=size, mode=m)

    r = archscan.scan(Up(), [shape], rules=[])
    (node,) = [n for n in r.nodes if n.category == "data_movement"]
    assert r.uncounted == {} and node.elem_ops == elem
    assert node.aten_ops == (f"aten.{aten_op}.default",)


def test_vision_formulas_name_ops_this_torch_has():
    """A misspelt registry name would silently never match: every aten name resolves to an op."""
    for key in set(_ELEM_FORMULAS) | set(_FLOP_FORMULAS):
        namespace, name = key.split("::")
        if namespace == "aten":
            assert hasattr(torch.ops.aten, name), key


# torchvision is not installed (and must not be imported): its ops are defined here, with
# torchvision's own schemas and stand-in kernels of the right output shapes, so the real path
# (dispatch -> cost_op -> the registry, keyed by name) runs as it would with torchvision loaded.
TORCHVISION_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align": "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
                 "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor",
    "roi_pool": "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
                "SymInt pooled_width) -> (Tensor, Tensor)",
    "ps_roi_align": "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
                    "SymInt pooled_width, int sampling_ratio) -> (Tensor, Tensor)",
    "deform_conv2d": "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
                     "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, "
                     "SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> Tensor",
}


def _nms(dets, scores, iou_threshold):
    return torch.argsort(scores, descending=True)  # keeps every box: the count does not depend on it


def _roi_align(input, rois, spatial_scale, ph, pw, sampling_ratio, aligned):
    return input.new_zeros((rois.shape[0], input.shape[1], ph, pw))


def _roi_pool(input, rois, spatial_scale, ph, pw):
    out = input.new_zeros((rois.shape[0], input.shape[1], ph, pw))
    return out, torch.zeros_like(out, dtype=torch.int32)


def _ps_roi_align(input, rois, spatial_scale, ph, pw, sampling_ratio):
    out = input.new_zeros((rois.shape[0], input.shape[1] // (ph * pw), ph, pw))
    return out, torch.zeros_like(out, dtype=torch.int32)


def _deform_conv2d(input, weight, offset, mask, bias, sh, sw, ph, pw, dh, dw, groups, offset_groups, use_mask):
    return F.conv2d(input, weight, bias, (sh, sw), (ph, pw), (dh, dw), groups)  # offsets change values only


@pytest.fixture(scope="module")
def torchvision_ops():
    lib = torch.library.Library("torchvision", "FRAGMENT")
    kernels = {"nms": _nms, "roi_align": _roi_align, "roi_pool": _roi_pool, "ps_roi_align": _ps_roi_align,
               "deform_conv2d": _deform_conv2d}
    for name, schema in TORCHVISION_SCHEMAS.items():
        if hasattr(torch.ops.torchvision, name):
            continue  # torchvision loaded by something else: its own kernels serve
        lib.define(schema)
        lib.impl(name, kernels[name], "CompositeExplicitAutograd")
        if name != "nms":  # nms's output size depends on the data: it has no fake kernel here
            torch.library.register_fake(f"torchvision::{name}", kernels[name], lib=lib)
    yield torch.ops.torchvision
    del lib  # the definitions go with the library object


def run_op(op, *args):
    out = op(*args)
    return cost_op(op, args, {}, out)


@pytest.mark.parametrize("sampling_ratio,points", [(3, 9), (-1, 4)])  # adaptive: 2x2 (Mask R-CNN)
def test_roi_align(torchvision_ops, sampling_ratio, points):
    class Head(nn.Module):
        def forward(self, x, rois):
            return torchvision_ops.roi_align(x, rois, 0.5, 2, 2, sampling_ratio, False)

    # 4 boxes, 3 channels, 2x2 bins: 48 outputs * points * 4 bilinear taps
    # MAC = features 3*8*8 + rois 4*5 + out 48 = 260 elements
    r = archscan.scan(Head(), [(1, 3, 8, 8), (4, 5)], rules=[])
    (node,) = r.nodes
    assert r.uncounted == {} and node.category == "pooling"
    assert (node.elem_ops, node.mac_bytes, node.flops) == (48 * points * 4, 4 * 260, 0)
    assert roi_align_elem_ops((4, 3, 2, 2), sampling_ratio) == 48 * points * 4


def test_roi_pool_and_ps_roi_align(torchvision_ops):
    x, rois = torch.randn(1, 8, 6, 6), torch.zeros(3, 5)
    # roi_pool: out [3, 8, 2, 2] = 96, one max per cell of a bin counted as 2x2: 384
    pool = run_op(torchvision_ops.roi_pool.default, x, rois, 1.0, 2, 2)
    assert (pool.category, pool.elem_ops, pool.counted) == ("pooling", 384, True)
    # MAC = features 288 + rois 15 + out 96 + argmax 96 (int32), all 4 bytes
    assert pool.mac_bytes == 4 * (288 + 15 + 96 + 96)
    # ps_roi_align: 8 channels / (2*2 bins) = 2 -> out [3, 2, 2, 2] = 24, sampling 2x2 = 4 points * 4 taps
    ps = run_op(torchvision_ops.ps_roi_align.default, x, rois, 1.0, 2, 2, 2)
    assert (ps.category, ps.elem_ops) == ("pooling", 24 * 4 * 4)


def test_nms_counts_every_pair_once(torchvision_ops):
    dets, scores = torch.rand(5, 4), torch.rand(5)
    c = run_op(torchvision_ops.nms.default, dets, scores, 0.5)
    # n = 5 boxes: 5*4/2 = 10 IoU comparisons (upper bound); MAC = boxes 20*4 + scores 5*4 + kept 5*8
    assert (c.category, c.elem_ops, c.flops, c.counted) == ("host_sync", 10, 0, True)
    assert c.mac_bytes == 80 + 20 + 40
    assert nms_elem_ops((1000, 4), (1000,), 0.7, out_shape=None) == 499_500


@pytest.mark.parametrize("groups,use_mask,category,flops,elem", [
    # input [1, 4, 5, 5], weight [6, 4/g, 3, 3], pad 1 -> [1, 6, 5, 5]
    # FLOPs = 1*6*5*5 * (4/g)*3*3; samples = 1*4*3*3*5*5 = 900, * 4 bilinear taps (+1 for the mask)
    (1, False, "conv", 5_400, 3_600),
    (1, True, "conv", 5_400, 4_500),
    (2, False, "grouped_conv", 2_700, 3_600),
])
def test_deform_conv2d(torchvision_ops, groups, use_mask, category, flops, elem):
    class Deform(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(6, 4 // groups, 3, 3))
            self.bias = nn.Parameter(torch.zeros(6))

        def forward(self, x, offset, mask):
            return torchvision_ops.deform_conv2d(x, self.weight, offset, mask, self.bias, 1, 1, 1, 1, 1, 1,
                                                 groups, 1, use_mask)

    r = archscan.scan(Deform(), [(1, 4, 5, 5), (1, 18, 5, 5), (1, 9, 5, 5)], rules=[])
    (node,) = [n for n in r.nodes if n.flops]
    assert r.uncounted == {}
    assert (node.category, node.flops, node.elem_ops) == (category, flops, elem)
    assert node.attrs["groups"] == groups and node.attrs["kernel"] == (3, 3)
    # MAC = input 100 + weight 6*(4/g)*9 + offset 450 + mask 225 + bias 6 + out 150 elements
    assert node.mac_bytes == 4 * (100 + 6 * (4 // groups) * 9 + 450 + 225 + 6 + 150)
    assert deform_conv2d_flops((1, 4, 5, 5), (6, 4 // groups, 3, 3), (1, 6, 5, 5)) == flops
