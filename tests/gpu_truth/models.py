"""The models of the recorded GPU configurations (``capture.py`` beside this file), built as
archscan loads a model file: ``archscan tests/gpu_truth/models.py:roberta_base --input 8,512:int64``.

The Hugging Face models need ``transformers``; the torchvision ones are archscan's zoo models of
the same layout (``zoo:resnet50``, ``zoo:mobilenet_v2``, ``zoo:vit_b_16``: equal parameter counts).
"""

from __future__ import annotations


def _sdpa(config):
    """SDPA attention and no KV cache, as the recorded runs called the models (``use_cache=False``)."""
    config.attn_implementation = "sdpa"
    config.use_cache = False
    return config


def roberta_base():
    import transformers
    return transformers.RobertaForMaskedLM(_sdpa(transformers.RobertaConfig(vocab_size=50265, max_position_embeddings=514)))


def llama_1b():
    import transformers
    return transformers.LlamaForCausalLM(_sdpa(transformers.LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=16384)))


def pythia_160m():
    import transformers
    return transformers.GPTNeoXForCausalLM(_sdpa(transformers.GPTNeoXConfig(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        vocab_size=50304, max_position_embeddings=2048)))


def bert_base():
    import transformers
    return transformers.BertForMaskedLM(_sdpa(transformers.BertConfig(vocab_size=30522, max_position_embeddings=512)))


def gpt2():
    import transformers
    return transformers.GPT2LMHeadModel(_sdpa(transformers.GPT2Config(n_embd=768, n_layer=12, n_head=12,
                                                                      vocab_size=50257, n_positions=1024)))


def qwen2_0_5b():
    import transformers
    return transformers.Qwen2ForCausalLM(_sdpa(transformers.Qwen2Config(
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
        vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True)))


def mistral_7b():
    import transformers
    return transformers.MistralForCausalLM(_sdpa(transformers.MistralConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=32000, max_position_embeddings=32768, sliding_window=None)))


def mixtral_small():
    import transformers
    return transformers.MixtralForCausalLM(_sdpa(transformers.MixtralConfig(
        hidden_size=1024, intermediate_size=3584, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
        num_local_experts=8, num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=32768,
        sliding_window=None)))


def vit_b_16():
    """torchvision's ``vit_b_16`` (torchvision 0.26's VisionTransformer, ``nn.MultiheadAttention``
    blocks, no dropout), written out: torchvision does not import beside the CPU build of torch.
    archscan's ``zoo:vit_b_16`` writes its attention by hand instead, which a GPU runs differently."""
    from collections import OrderedDict

    import torch
    import torch.nn as nn

    hidden, heads, layers, mlp, patch, image = 768, 12, 12, 3072, 16, 224

    class EncoderBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(hidden, eps=1e-6)
            self.self_attention = nn.MultiheadAttention(hidden, heads, dropout=0.0, batch_first=True)
            self.dropout = nn.Dropout(0.0)
            self.ln_2 = nn.LayerNorm(hidden, eps=1e-6)
            self.mlp = nn.Sequential(nn.Linear(hidden, mlp), nn.GELU(), nn.Dropout(0.0), nn.Linear(mlp, hidden),
                                     nn.Dropout(0.0))

        def forward(self, input):
            x = self.ln_1(input)
            x, _ = self.self_attention(x, x, x, need_weights=False)
            x = self.dropout(x) + input
            return x + self.mlp(self.ln_2(x))

    class Encoder(nn.Module):
        def __init__(self, seq):
            super().__init__()
            self.pos_embedding = nn.Parameter(torch.empty(1, seq, hidden).normal_(std=0.02))
            self.dropout = nn.Dropout(0.0)
            self.layers = nn.Sequential(OrderedDict((f"encoder_layer_{i}", EncoderBlock()) for i in range(layers)))
            self.ln = nn.LayerNorm(hidden, eps=1e-6)

        def forward(self, input):
            return self.ln(self.layers(self.dropout(input + self.pos_embedding)))

    class VisionTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv_proj = nn.Conv2d(3, hidden, kernel_size=patch, stride=patch)
            self.class_token = nn.Parameter(torch.zeros(1, 1, hidden))
            self.encoder = Encoder((image // patch) ** 2 + 1)
            self.heads = nn.Sequential(OrderedDict(head=nn.Linear(hidden, 1000)))

        def forward(self, x):
            n = x.shape[0]
            x = self.conv_proj(x).reshape(n, hidden, -1).permute(0, 2, 1)
            x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
            return self.heads(self.encoder(x)[:, 0])

    return VisionTransformer()


def resnet50():
    """torchvision's ``resnet50`` as torchvision 0.26 writes its forward (``out = self.conv3(out)``
    then ``out = self.bn3(out)``, ``out += identity``): which tensors Python holds while a layer
    runs follows the code, and archscan's ``zoo:resnet50`` (same layers) writes it otherwise."""
    import torch
    import torch.nn as nn

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            identity = x
            out = self.conv1(x)
            out = self.bn1(out)
            out = self.relu(out)
            out = self.conv2(out)
            out = self.bn2(out)
            out = self.relu(out)
            out = self.conv3(out)
            out = self.bn3(out)
            if self.downsample is not None:
                identity = self.downsample(x)
            out += identity
            out = self.relu(out)
            return out

    class ResNet(nn.Module):
        def __init__(self, layers=(3, 4, 6, 3)):
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            self.layer1 = self._make_layer(64, layers[0])
            self.layer2 = self._make_layer(128, layers[1], 2)
            self.layer3 = self._make_layer(256, layers[2], 2)
            self.layer4 = self._make_layer(512, layers[3], 2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(2048, 1000)

        def _make_layer(self, planes, blocks, stride=1):
            downsample = None
            if stride != 1 or self.inplanes != planes * 4:
                downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride, bias=False),
                                           nn.BatchNorm2d(planes * 4))
            layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes * 4
            layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
            return nn.Sequential(*layers)

        def forward(self, x):
            x = self.conv1(x)
            x = self.bn1(x)
            x = self.relu(x)
            x = self.maxpool(x)
            x = self.layer1(x)
            x = self.layer2(x)
            x = self.layer3(x)
            x = self.layer4(x)
            x = self.avgpool(x)
            x = torch.flatten(x, 1)
            return self.fc(x)

    return ResNet()


# The recorded memory configurations (summary.jsonl), as archscan analyses them:
# id -> (target, input, dtype of the weights, autocast, training step)
HERE = "tests/gpu_truth/models.py"
MEMORY_CASES = {
    "mem_resnet50_train_b32": (f"{HERE}:resnet50", "32,3,224,224", None, None, True),
    "mem_mobilenet_v2_train_b64": ("zoo:mobilenet_v2", "64,3,224,224", None, None, True),
    "mem_vit_b_16_train_b16": (f"{HERE}:vit_b_16", "16,3,224,224", None, None, True),
    "mem_roberta_base_train_8x512": (f"{HERE}:roberta_base", "8,512:int64", None, None, True),
    "mem_roberta_base_train_8x512_bf16": (f"{HERE}:roberta_base", "8,512:int64", None, "bf16", True),
    "mem_pythia_160m_train_4x1024": (f"{HERE}:pythia_160m", "4,1024:int64", None, None, True),
    "mem_llama_1b_train_2x2048_bf16w": (f"{HERE}:llama_1b", "2,2048:int64", "bfloat16", None, True),
    "mem_resnet50_fwd_b64": (f"{HERE}:resnet50", "64,3,224,224", None, None, False),
    "mem_vit_b_16_fwd_b64": (f"{HERE}:vit_b_16", "64,3,224,224", None, None, False),
    "mem_llama_1b_fwd_1x8192_bf16": (f"{HERE}:llama_1b", "1,8192:int64", "bfloat16", None, False),
}
# Recorded with the model's own loss (labels=input_ids), the output held to the end: archscan's
# default step (--loss auto); the cases above sum the outputs and release them (--loss sum --release-output).
OWN_LOSS = ("mem_roberta_base_train_8x512_labels", "mem_llama_1b_train_2x2048_bf16w_labels")

# The held-out set, recorded on an H100 (heldout-h100-2026-11-26): kept apart from the recorded set
# above, which the GPU execution model was read from. The torchvision models (ConvNeXt-T,
# EfficientNet-B0, Swin-T) need torchvision, which does not import beside the CPU build of torch.
HELDOUT = "heldout-h100-2026-11-26"
HELDOUT_MEMORY_CASES = {
    "mem_bert_base_train_8x512": (f"{HERE}:bert_base", "8,512:int64", None, None, True),
    "mem_bert_base_train_8x512_bf16": (f"{HERE}:bert_base", "8,512:int64", None, "bf16", True),
    "mem_gpt2_train_4x1024": (f"{HERE}:gpt2", "4,1024:int64", None, None, True),
    "mem_qwen2_0_5b_train_2x1024_bf16w": (f"{HERE}:qwen2_0_5b", "2,1024:int64", "bfloat16", None, True),
}
# largest batch under a budget: id -> (target, input of batch 1, training step)
HELDOUT_BATCH_CASES = {
    "maxbatch_gpt2_train_x1024_12gib": (f"{HERE}:gpt2", "1,1024:int64", True),
    "maxbatch_bert_base_train_x512_8gib": (f"{HERE}:bert_base", "1,512:int64", True),
}
