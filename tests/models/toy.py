"""Small models for archscan's tests: each exercises one capture path or cost formula."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    """conv(3->8, 3x3) -> BN -> ReLU -> avgpool -> fc(8->10)."""

    def __init__(self, num_classes: int = 10, width: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x):
        x = self.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class NeedsArgs(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return self.fc(x)


class ShapeBranch(nn.Module):
    """Python control flow on a shape: fx cannot trace it, torch.export can."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        if x.shape[-1] > 8:
            y = y * 2
        return y


class DataBranch(nn.Module):
    """Control flow on a tensor's value: fx and export both fail; eager capture records the path."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        y = self.conv(x)
        if y.abs().mean() > -1:  # always true: the taken path includes the relu
            y = torch.relu(y)
        return self.fc(y.mean((2, 3)))


class Broken(nn.Module):
    """Cannot run at all."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) @ torch.ones(3, 3)  # line named in the error


class BrokenAfterBranch(nn.Module):
    """Untraceable (tensor-valued branch) and then unable to run."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > -1e9:
            x = x.reshape(3, -1)  # line named in the error
        return self.fc(x)


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 8)
        self.b = nn.Linear(10, 8)

    def forward(self, x, y):
        return self.a(x) + self.b(y)


class Tokens(nn.Module):
    def __init__(self, vocab: int = 100, dim: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        return self.head(self.emb(ids))


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(8, 8)
        self.spare = nn.Linear(8, 1000)  # 9000 parameters never used

    def forward(self, x):
        return self.used(x)


class SelfAttention(nn.Module):
    """nn.MultiheadAttention, self-attention, batch first: takes the fused path in eval."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class Sdpa(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def make_net(num_classes: int = 10):
    """A factory function."""
    return Net(num_classes=num_classes)


instance = Net()
not_a_model = 42


class ItemScale(nn.Module):
    """.item() outside control flow: traceable, but fake tensors have no value to give."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        s = x.abs().max().item()
        return self.fc(x) * s


class NonZero(nn.Module):
    """nonzero(): the output size depends on the data."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        idx = torch.nonzero(x[:, 0] > -100).squeeze(1)
        return self.fc(x[idx])


class HostTensor(nn.Module):
    """Builds a tensor on the host and moves one with .to() on every call."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x) + torch.tensor([1.0]) + torch.ones(8).to(x.device)


class WithBuffer(nn.Module):
    """The same constants, registered once as buffers."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("offset", torch.ones(8))

    def forward(self, x):
        return self.fc(x) + self.offset


class Chain(nn.Module):
    """Out-of-place element-wise chain: sigmoid -> mul -> add, each temporary read once."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = torch.sigmoid(self.fc(x))
        return y * 2 + 1


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(self.fc1(x))
