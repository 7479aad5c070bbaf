"""fvcore as an independent oracle (it traces a real forward with torch.jit).

Known differences, each checked here rather than tolerated:
* fvcore also counts batch_norm, layer_norm and adaptive_avg_pool2d as FLOPs; archscan keeps
  that work out of FLOPs (it is element work: ShuffleNetV2 G4). We compare fvcore's conv +
  linear + matmul operators only, and check its batch_norm count is twice our norm element ops
  (fvcore counts normalize + affine per element; archscan counts one element op per output).
* fvcore has no handle for aten::scaled_dot_product_attention (it lists it as unsupported), so
  it misses QK^T and AV: archscan = fvcore + layers * 2 * tokens^2 * dim, exactly.
"""

import logging
import warnings

import pytest
import torch

import archscan
from archscan import zoo

fvcore = pytest.importorskip("fvcore.nn")

MATMUL_LIKE = ("conv", "linear", "matmul", "bmm", "einsum", "addmm")


def fvcore_counts(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            analysis = fvcore.FlopCountAnalysis(model, x)
            analysis.unsupported_ops_warnings(False)
            analysis.uncalled_modules_warnings(False)
            return dict(analysis.by_operator()), dict(analysis.unsupported_ops())
        finally:
            logging.disable(logging.NOTSET)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "shufflenet_v2_x0_5"])
def test_cnn_flops_equal_fvcore(name):
    model = zoo.create_model(name).eval()
    x = torch.randn(1, 3, 224, 224)
    by_op, _ = fvcore_counts(model, x)
    report = archscan.scan(model, [x])
    assert report.totals.flops == sum(v for k, v in by_op.items() if k in MATMUL_LIKE)
    norm_elem = sum(n.elem_ops for n in report.nodes if n.category == "norm")
    assert by_op["batch_norm"] == 2 * norm_elem  # fvcore: 2 per element for an affine BN in eval


@pytest.mark.parametrize("name,tokens,layers,dim", [("vit_tiny", 197, 12, 192), ("vit_tiny_sdpa", 197, 12, 192),
                                                     ("llama_tiny", 16, 4, 256)])
def test_transformer_flops_equal_fvcore_plus_attention(name, tokens, layers, dim):
    model = zoo.create_model(name).eval()
    x = torch.zeros(1, tokens, dtype=torch.long) if name.startswith("llama") else torch.randn(1, 3, 224, 224)
    by_op, unsupported = fvcore_counts(model, x)
    assert unsupported.get("aten::scaled_dot_product_attention", 0) == layers
    report = archscan.scan(model, [x])
    fv = sum(v for k, v in by_op.items() if k in MATMUL_LIKE)
    assert report.totals.flops == fv + layers * 2 * tokens * tokens * dim
