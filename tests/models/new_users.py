"""Models for tests/test_new_users.py, each scanned through the file path (class or factory)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class LSTMHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(64, 128, batch_first=True)
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


class StackedGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(32, 48, num_layers=2, bidirectional=True)

    def forward(self, x):
        return self.rnn(x)[0]


class TanhRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(16, 24, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]


class PackedLSTM(nn.Module):
    """Token ids and their lengths: pack_padded_sequence needs lengths above 0."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.lstm = nn.LSTM(16, 32, batch_first=True)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(x), lengths, batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)
        return h[-1]


def conv_net(width=1.0, act="relu"):
    """A factory whose constructor arguments change the model."""
    c = int(32 * width)
    return nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU() if act == "relu" else nn.GELU(),
                         nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))


class Residual(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

    def forward(self, x):
        return x + self.bn2(self.conv2(self.bn1(self.conv1(x)).relu())).relu().sigmoid() * 0.5


class Stage(nn.Module):
    """A custom (non-container) stage holding its blocks, as timm's *Stage and diffusers' down blocks do."""

    def __init__(self, n=4):
        super().__init__()
        self.blocks = nn.Sequential(*[Residual() for _ in range(n)])

    def forward(self, x):
        return self.blocks(x)


class Staged(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.stages = nn.Sequential(Stage(), Stage())

    def forward(self, x):
        return self.stages(self.stem(x))


class Flat(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.blocks = nn.Sequential(*[Residual() for _ in range(8)])

    def forward(self, x):
        return self.blocks(self.stem(x))


class Casts(nn.Module):
    """Dtype casts in forward (mixed-precision code): not device moves."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("inv_freq", torch.ones(8, dtype=torch.bfloat16), persistent=False)

    def forward(self, x):
        x = x.to(self.proj.weight.dtype)
        y = self.proj(x).type_as(x)
        freq = self.inv_freq.to(device=x.device, dtype=torch.float)  # Hugging Face's rotary embeddings
        return y.to(torch.float32) + y.float() + freq


class DeviceArguments(nn.Module):
    """Tensors made on, and moved to, the weights' device in forward (Hugging Face's rotary and
    cache code), beside a dtype cast of a buffer; the shape check keeps torch.fx out."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("inv_freq", torch.ones(8), persistent=False)

    def forward(self, x):
        if x.shape[-1] != 8:
            raise ValueError("expected 8 features")
        bias = torch.zeros(8, device=self.proj.weight.device)
        freq = self.inv_freq[None, :].to(x.device)
        half = self.inv_freq.to(device=x.device, dtype=torch.float16).float()
        return self.proj(x.to(self.proj.weight.device)) + bias + freq + half


class OptionalPath(nn.Module):
    """A mask token used only when a mask is given (DINOv2's, Longformer's global attention)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.mask_token = nn.Parameter(torch.zeros(8))

    def forward(self, x, mask=None):
        if mask is not None:
            x = torch.where(mask[..., None], self.mask_token, x)
        return self.proj(x)


class Temperature(nn.Module):
    """Attention with a learned per-head temperature (XCiT's): the scores times a [heads, 1, 1] parameter."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.temperature = nn.Parameter(torch.rand(heads, 1, 1) + 0.5)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1)) * self.temperature
        return self.proj((attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, c))


class RelativeBiasReturned(nn.Module):
    """Attention whose weights are also returned: they must be written, so fuse leaves it and says why."""

    def __init__(self, dim=32):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attn = (q @ k.transpose(-2, -1) * 0.125).softmax(dim=-1)
        return attn @ v, attn


class CachedBiasAttention(nn.Module):
    """Attention biases gathered from a table and kept per device in eval mode (timm's LeViT,
    TinyViT, EfficientViT-M): one forward fills the cache, and a capture after it must still see
    the parameter. The shape check keeps torch.fx out."""

    def __init__(self, dim=32, tokens=16):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attention_biases = nn.Parameter(torch.zeros(tokens))
        self.register_buffer("idx", torch.arange(tokens * tokens).remainder(tokens).view(tokens, tokens),
                             persistent=False)
        self.bias_cache = {}

    def train(self, mode=True):
        super().train(mode)
        if mode:
            self.bias_cache = {}
        return self

    def biases(self, device):
        if self.training:
            return self.attention_biases[self.idx]
        if str(device) not in self.bias_cache:
            self.bias_cache[str(device)] = self.attention_biases[self.idx]
        return self.bias_cache[str(device)]

    def forward(self, x):
        if x.shape[1] != self.idx.shape[0]:
            raise ValueError(f"expected {self.idx.shape[0]} tokens")
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return (q @ k.transpose(-2, -1) * 0.125 + self.biases(x.device)).softmax(dim=-1) @ v


class WideKeyAttention(nn.Module):
    """scaled_dot_product_attention with keys wider than its values (DeepSeek's MLA: 192 beside
    128): the CPU runs its math path, a softmax between two matrix products inside one call.
    The shape check keeps torch.fx out."""

    def __init__(self, dim=32):
        super().__init__()
        self.qk = nn.Linear(dim, 2 * dim)
        self.v = nn.Linear(dim, dim // 2)

    def forward(self, x):
        if x.shape[1] < 2:
            raise ValueError("expected two tokens or more")
        q, k = self.qk(x).chunk(2, dim=-1)
        return nn.functional.scaled_dot_product_attention(q, k, self.v(x), is_causal=True)


class SlidingWindowAttention(nn.Module):
    """Attention under a sliding-window mask the model builds from positions (Mistral's, Gemma's
    local layers); or under a mask given as an input. The shape check keeps torch.fx out."""

    def __init__(self, dim=32, heads=4, window=4):
        super().__init__()
        self.heads, self.window = heads, window
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x, mask=None):
        b, s, c = x.shape
        if s < 2:
            raise ValueError("expected two tokens or more")
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if mask is None:
            i = torch.arange(s, device=x.device)[:, None]
            j = torch.arange(s, device=x.device)[None, :]
            mask = (j <= i) & (j > i - self.window)
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(b, s, c)


class NamedOutput(nn.Module):
    """Returns a namedtuple in training mode (torchvision's inception_v3 returns InceptionOutputs)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(*[Residual() for _ in range(3)])
        self.head = nn.Linear(16, 10)
        self.aux = nn.Linear(16, 10)

    def forward(self, x):
        import collections

        y = self.blocks(self.stem(x)).mean((2, 3))
        if self.training:
            return collections.namedtuple("Outputs", ["logits", "aux_logits"])(self.head(y), self.aux(y))
        return self.head(y)


class FixedByTheTask(nn.Module):
    """A balanced strided patch embedding, an unbalanced 1x1 conv, and a 2-class output conv."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(32, 32, 7, stride=4, padding=3)
        self.expand = nn.Conv2d(32, 256, 1)
        self.head = nn.Conv2d(256, 2, 1)

    def forward(self, x):
        return self.head(self.expand(self.patch(x)))


class Activations(nn.Module):
    """Activations with no pointwise tag (Hardswish, in-place Mish), a per-channel PReLU, and a
    torch.roll over the spatial dims (Swin's shifted windows): none of them moves channels."""

    def __init__(self):
        super().__init__()
        self.c1, self.a1 = nn.Conv2d(3, 32, 3, padding=1), nn.Hardswish()
        self.c2, self.a2 = nn.Conv2d(32, 32, 3, padding=1), nn.PReLU(32)
        self.c3, self.a3 = nn.Conv2d(32, 32, 3, padding=1), nn.Mish(inplace=True)
        self.c4 = nn.Conv2d(32, 32, 3, padding=1)
        self.head = nn.Conv2d(32, 10, 1)

    def forward(self, x):
        x = self.a3(self.c3(self.a2(self.c2(self.a1(self.c1(x))))))
        return self.head(torch.roll(self.c4(x), shifts=(2, 2), dims=(2, 3)))


class PooledChannelsLast(nn.Module):
    """A global pool over a channels-last map (a permuted layer norm leaves it so, as ConvNeXt's
    stages do): the pool's [N, C, 1, 1] result is restrided in place (aten.as_strided_)."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(3, 32, 3, padding=1), nn.LayerNorm(32)
        self.conv2, self.head = nn.Conv2d(32, 64, 1), nn.Linear(64, 10)

    def forward(self, x):
        x = self.norm(self.conv(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.head(F.adaptive_avg_pool2d(self.conv2(x), 1).flatten(1))


class ChannelsLastBlock(nn.Module):
    """A block on [N, H, W, C] maps (timm's sequencer2d): an MLP over the last dim."""

    def __init__(self, c=32):
        super().__init__()
        self.norm = nn.LayerNorm(c)
        self.mlp = nn.Sequential(nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class ChannelsLast(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 4, stride=4)
        self.blocks = nn.Sequential(*[ChannelsLastBlock() for _ in range(4)])
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.stem(x).permute(0, 2, 3, 1)  # N, H, W, C
        return self.head(self.blocks(x).mean((1, 2)))


class GroupedExperts(nn.Module):
    """A mixture of experts run as transformers 5 runs them: top-k routing, tokens sorted by
    expert, one grouped GEMM per projection (F.grouped_mm)."""

    def __init__(self, dim=32, hidden=64, experts=8, k=2):
        super().__init__()
        self.k, self.experts = k, experts
        self.router = nn.Linear(dim, experts, bias=False)
        self.up = nn.Parameter(torch.randn(experts, dim, hidden) * 0.02)
        self.down = nn.Parameter(torch.randn(experts, hidden, dim) * 0.02)

    def forward(self, x):
        tokens = x.reshape(-1, x.shape[-1])
        weights, chosen = self.router(tokens).softmax(-1).topk(self.k, dim=-1)
        flat = chosen.reshape(-1)
        order = flat.argsort()
        rows = tokens.repeat_interleave(self.k, dim=0)[order]
        counts = torch.histc(flat.float(), bins=self.experts, min=0, max=self.experts - 1)
        offs = counts.cumsum(0).to(torch.int32)
        h = torch.nn.functional.grouped_mm(rows, self.up, offs=offs).relu()
        out = torch.nn.functional.grouped_mm(h, self.down, offs=offs)
        back = torch.empty_like(out)
        back[order] = out
        return (back.reshape(-1, self.k, x.shape[-1]) * weights[..., None]).sum(1).reshape(x.shape)


class LatentCacheDecoder(nn.Module):
    """Caches one compressed latent per token and re-expands all of it every step, as Hugging Face's
    DeepSeek-V3 attention is written (serving kernels keep the latent and fold ``up`` away)."""

    def __init__(self, vocab=100, dim=32, latent=8, heads=2, head_dim=16, window=None):
        super().__init__()
        self.heads, self.head_dim, self.window = heads, head_dim, window  # window: keep the last tokens only
        self.embed = nn.Embedding(vocab, dim)
        self.down = nn.Linear(dim, latent, bias=False)
        self.up = nn.Linear(latent, heads * 2 * head_dim, bias=False)
        self.q = nn.Linear(dim, heads * head_dim, bias=False)
        self.out = nn.Linear(heads * head_dim, vocab, bias=False)

    def forward(self, ids, past_key_values=None, use_cache=False):
        x = self.embed(ids)
        b, t, _ = x.shape
        latent = self.down(x)
        if past_key_values is not None:
            latent = torch.cat([past_key_values, latent], dim=1)
        if self.window is not None:
            latent = latent[:, -self.window:]
        kv = self.up(latent).view(b, latent.shape[1], self.heads, 2 * self.head_dim).transpose(1, 2)
        k, v = kv.split(self.head_dim, dim=-1)
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        y = self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, -1))
        return (y, latent) if use_cache else y


class WindowCacheDecoder(nn.Module):
    """A decoder with a KV cache whose attention mask it builds from positions, as Mistral's and
    Gemma's local layers do: new token i (at position L + i after L cached) sees the cached and new
    keys at positions L + i - window + 1 .. L + i (``window=None``: all up to its own)."""

    def __init__(self, vocab=100, dim=32, heads=2, window=None):
        super().__init__()
        self.heads, self.window = heads, window
        self.embed = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, vocab, bias=False)

    def _qkv(self, ids):
        x = self.embed(ids)
        b, t, c = x.shape
        return x, (*self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4),)

    def forward(self, ids, past_key_values=None, use_cache=False):
        x, (q, k, v) = self._qkv(ids)
        b, t, c = x.shape
        start = 0 if past_key_values is None else past_key_values[0].shape[2]
        if past_key_values is not None:
            k, v = torch.cat([past_key_values[0], k], dim=2), torch.cat([past_key_values[1], v], dim=2)
        i = torch.arange(start, start + t, device=x.device)[:, None]  # the new tokens' positions
        j = torch.arange(start + t, device=x.device)[None, :]          # every key's
        mask = j <= i
        if self.window is not None:
            mask = mask & (j > i - self.window)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, t, c)
        return (self.out(y), (k, v)) if use_cache else self.out(y)


class StaticWindowDecoder(WindowCacheDecoder):
    """A decoder whose KV cache is a static buffer of ``max_len`` tokens, written in place, whose
    attention reads only the last ``window`` of it: Gemma's and Mistral's sliding-window layers
    over a static cache (the cache holds ``max_len``; a step reads ``window``)."""

    def __init__(self, vocab=100, dim=32, heads=2, window=8, max_len=256):
        super().__init__(vocab, dim, heads, window)
        self.max_len = max_len

    def forward(self, ids, past_key_values=None, use_cache=False):
        x, (q, k, v) = self._qkv(ids)
        b, t, c = x.shape
        if past_key_values is None:
            keys = x.new_zeros(b, self.heads, self.max_len, c // self.heads)
            past_key_values = (keys, torch.zeros_like(keys), 0)
        keys, values, start = past_key_values
        keys[:, :, start:start + t] = k
        values[:, :, start:start + t] = v
        first = max(0, start + t - self.window)
        y = F.scaled_dot_product_attention(q, keys[:, :, first:start + t], values[:, :, first:start + t])
        y = self.out(y.transpose(1, 2).reshape(b, t, c))
        return (y, (keys, values, start + t)) if use_cache else y


def _llama(kv_heads: int) -> nn.Module:
    from archscan.zoo.llama import Llama

    return Llama(vocab_size=1000, dim=64, n_layers=2, n_heads=4, n_kv_heads=kv_heads, max_seq_len=512)


def llama_mha() -> nn.Module:
    """Attention variants of one config, for compare --decode: 4 KV heads of 4 query heads."""
    return _llama(4)


def llama_gqa() -> nn.Module:
    return _llama(2)


def llama_mqa() -> nn.Module:
    return _llama(1)
