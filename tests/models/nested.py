"""Models whose inputs nest (tests/test_nested_inputs.py), for command-line targets."""

import torch.nn as nn


class Images(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, images):
        return [self.conv(image[None]) for image in images]


class Conditioned(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.time = nn.Linear(6, 8)

    def forward(self, x, added_cond_kwargs):
        return self.proj(x) + self.time(added_cond_kwargs["time_ids"]) + added_cond_kwargs["text_embeds"]
