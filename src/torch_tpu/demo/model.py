"""Tiny reference models used by the demo and the training-parity tests.

Plain PyTorch modules with nothing device-specific in them: they run unchanged on ``cpu`` and
``tpu``, which is what lets the tests compare the two step by step.

Example::

    >>> import torch
    >>> from torch_tpu.demo.model import GPT, GPTConfig
    >>> _ = torch.manual_seed(0)
    >>> model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16))
    >>> logits, loss = model(torch.randint(0, 16, (2, 8)), targets=torch.randint(0, 16, (2, 8)))
    >>> tuple(logits.shape), loss.dim()
    ((2, 8, 16), 0)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MLP", "SmallCNN", "GPTConfig", "GPT"]


class MLP(nn.Module):
    """A multilayer perceptron: ``Linear -> GELU -> Dropout`` per hidden layer, then a linear head.

    Example::

        >>> import torch
        >>> from torch_tpu.demo.model import MLP
        >>> MLP(in_features=4, hidden=(8, 8), out_features=3)(torch.zeros(5, 4)).shape
        torch.Size([5, 3])
    """

    def __init__(
        self,
        in_features: int,
        hidden: tuple[int, ...] = (64, 64),
        out_features: int = 10,
        dropout: float = 0.0,
    ):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, size), nn.GELU(), nn.Dropout(dropout)]
            width = size
        layers.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """An image classifier touching the common vision ops: conv2d, batch norm, ReLU, max pool,
    average pool and adaptive average pool.

    ``activation`` and ``first_pool`` replace the ReLUs and the max pool (with ``nn.GELU`` and
    ``nn.AvgPool2d``, every layer is smooth: a training run then depends continuously on rounding,
    which comparing two devices' runs step by step needs).

    Example::

        >>> import torch
        >>> from torch_tpu.demo.model import SmallCNN
        >>> SmallCNN(in_channels=3, num_classes=5)(torch.zeros(2, 3, 16, 16)).shape
        torch.Size([2, 5])
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        width: int = 8,
        activation: type[nn.Module] = nn.ReLU,
        first_pool: type[nn.Module] = nn.MaxPool2d,
    ):
        super().__init__()

        def conv_block(cin: int, cout: int) -> nn.Sequential:
            # bias=False: batch norm's shift makes a conv bias redundant (the usual ResNet choice)
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), activation()
            )

        self.features = nn.Sequential(
            conv_block(in_channels, width),
            first_pool(2),
            conv_block(width, 2 * width),
            nn.AvgPool2d(2),
            conv_block(2 * width, 4 * width),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


@dataclasses.dataclass
class GPTConfig:
    """Hyperparameters of :class:`GPT`.

    ``norm`` picks LayerNorm or RMSNorm for every normalization; ``mlp`` picks a GELU MLP or a
    SiLU-gated (SwiGLU) one; ``tie_weights`` shares the token embedding with the LM head.
    """

    vocab_size: int
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = True
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    mlp: Literal["gelu", "swiglu"] = "gelu"
    tie_weights: bool = True

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {self.norm!r}")
        if self.mlp not in ("gelu", "swiglu"):
            raise ValueError(f"mlp must be 'gelu' or 'swiglu', got {self.mlp!r}")


def _norm(config: GPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=1e-5)
    return nn.LayerNorm(config.n_embd, bias=config.bias)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        # (B, T, C) -> (B, heads, T, head_dim)
        q, k, v = (t.view(batch, time, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(batch, time, channels)
        return self.resid_dropout(self.proj(y))


class FeedForward(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = 4 * config.n_embd
        self.gated = config.mlp == "swiglu"
        if self.gated:
            # SwiGLU keeps the parameter count of the 4x GELU MLP with a 2/3 narrower hidden layer
            hidden = 2 * hidden // 3
            self.gate = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.up = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.down = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.silu(self.gate(x)) * self.up(x) if self.gated else F.gelu(self.up(x))
        return self.dropout(self.down(hidden))


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.norm1 = _norm(config)
        self.attn = CausalSelfAttention(config)
        self.norm2 = _norm(config)
        self.mlp = FeedForward(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """A small decoder-only transformer language model (GPT-2 layout, pre-norm).

    ``forward(idx, targets=None)`` returns ``(logits, loss)``; ``loss`` is the mean token
    cross-entropy when ``targets`` is given, else ``None``.

    Example::

        >>> import torch
        >>> from torch_tpu.demo.model import GPT, GPTConfig
        >>> _ = torch.manual_seed(0)
        >>> config = GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=16,
        ...                    norm="rmsnorm", mlp="swiglu", tie_weights=False)
        >>> model = GPT(config)
        >>> model.generate(torch.zeros(1, 1, dtype=torch.long), max_new_tokens=5).shape
        torch.Size([1, 6])
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.n_embd)
        self.position_embedding = nn.Embedding(config.block_size, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.final_norm = _norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.token_embedding.weight
        self.apply(self._init_weights)
        # GPT-2: scale residual projections by depth so the residual stream's variance stays put
        for name, parameter in self.named_parameters():
            if name.endswith(("proj.weight", "down.weight")):
                nn.init.normal_(parameter, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        time = idx.shape[1]
        if time > self.config.block_size:
            raise ValueError(f"sequence length {time} exceeds block_size {self.config.block_size}")
        positions = torch.arange(time, device=idx.device)
        x = self.dropout(self.token_embedding(idx) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.final_norm(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def generate(
        self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, greedy: bool = False
    ) -> torch.Tensor:
        """Extend ``idx`` (B, T) by ``max_new_tokens`` tokens, sampling from the model (or taking
        the most likely token when ``greedy``). Sampling uses the device's default generator, so
        seed it (``torch.manual_seed``) for a reproducible sample."""
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size :]
            logits = self(context)[0][:, -1, :]
            if greedy:
                next_token = logits.argmax(dim=-1, keepdim=True)
            else:
                # argmax(p / E) with E ~ Exp(1) samples from p exactly (the exponential race);
                # unlike torch.multinomial it stays on the device without a host round trip
                probs = F.softmax(logits / temperature, dim=-1)
                next_token = (probs / torch.empty_like(probs).exponential_()).argmax(-1, keepdim=True)
            idx = torch.cat((idx, next_token), dim=1)
        return idx
