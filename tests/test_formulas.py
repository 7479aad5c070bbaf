"""Exact integers on tiny shapes, with the arithmetic in a comment.

Convention: FLOPs = multiply-adds; MAC = bytes read (distinct tensors, weights included) +
bytes written, float32 = 4 bytes per element unless stated.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import archscan


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
