"""Int8 linear layers: close to float32 on every token, embeddings untouched, and the real model's
perplexity on a public-domain text within 2% of float32."""

import copy
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from scheduler.quantize import Int8Linear, quantize_linears

TEXT = Path(__file__).parent / "data" / "public_domain.txt"


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Per row: the error's norm over the exact output's norm."""
    return (got - want).norm(dim=-1) / want.norm(dim=-1)


def test_int8_linear_is_close_on_tokens_of_very_different_size():
    torch.manual_seed(0)
    linear = nn.Linear(576, 960)
    # One step packs tokens whose magnitudes differ by orders: each must keep its own precision.
    x = torch.randn(2, 8, 576) * torch.logspace(-3, 2, 8)[None, :, None]
    with torch.inference_mode():
        got, want = Int8Linear(linear)(x), linear(x)
    assert got.shape == want.shape
    assert _relative_error(got, want).max() < 0.02


def test_int8_linear_handles_outlier_channels():
    torch.manual_seed(1)
    linear = nn.Linear(1536, 576, bias=False)
    x = torch.randn(4, 1536)
    x[:, 7] = 40.0  # one large channel, as real hidden states have
    with torch.inference_mode():
        assert _relative_error(Int8Linear(linear)(x), linear(x)).max() < 0.02


class _TinyLM(nn.Module):
    """An embedding, two projections and an output head tied to the embedding, as small LMs are built."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 32)
        self.layers = nn.ModuleList([nn.ModuleDict({"up": nn.Linear(32, 64), "down": nn.Linear(64, 32)})])
        self.lm_head = nn.Linear(32, 100, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = h + layer["down"](torch.relu(layer["up"](h)))
        return self.lm_head(h)


def test_quantize_linears_replaces_every_linear_and_keeps_the_tied_embedding():
    torch.manual_seed(2)
    model = _TinyLM()
    embedding, before = model.embed.weight, model.embed.weight.detach().clone()
    ids = torch.randint(0, 100, (3, 5))
    with torch.inference_mode():
        want = model(ids)
        assert quantize_linears(model) is model
        got = model(ids)
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model.lm_head, Int8Linear)
    assert model.embed.weight is embedding and torch.equal(model.embed.weight, before)
    assert _relative_error(got, want).max() < 0.05


def test_quantize_linears_skips_by_pattern_and_fp32_is_a_no_op():
    model = _TinyLM()
    quantize_linears(model, skip=["*.down", "lm_head"])
    assert isinstance(model.layers[0]["up"], Int8Linear)
    assert type(model.layers[0]["down"]) is nn.Linear and type(model.lm_head) is nn.Linear
    plain = _TinyLM()
    assert quantize_linears(plain, "fp32") is plain and isinstance(plain.layers[0]["up"], nn.Linear)
    with pytest.raises(ValueError):
        quantize_linears(plain, "int4")
    assert isinstance(quantize_linears(nn.Linear(8, 8)), Int8Linear)


def test_a_layer_reached_by_two_paths_is_quantized_once():
    shared = nn.Linear(16, 16)
    tree = nn.ModuleDict({"a": nn.Sequential(shared), "b": nn.Sequential(shared)})
    quantize_linears(tree)
    assert isinstance(tree["a"][0], Int8Linear) and tree["a"][0] is tree["b"][0]


def _perplexity(model: nn.Module, ids: torch.Tensor, window: int = 512) -> float:
    """Perplexity over consecutive windows, each predicted from its own start."""
    nll, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(ids) - 1, window):
            chunk = ids[start:start + window + 1]
            logits = model(input_ids=chunk[None, :-1]).logits[0].float()
            nll += nn.functional.cross_entropy(logits, chunk[1:], reduction="sum").item()
            count += len(chunk) - 1
    return math.exp(nll / count)


def test_int8_perplexity_is_within_two_percent_of_fp32(llm):
    model, tokenizer = llm
    text = "\n".join(line for line in TEXT.read_text().splitlines() if not line.startswith("#"))
    ids = tokenizer(text, return_tensors="pt").input_ids[0][:2048]
    assert len(ids) == 2048
    fp32 = _perplexity(model, ids)
    int8 = _perplexity(quantize_linears(copy.deepcopy(model)), ids)
    assert int8 < fp32 * 1.02, f"int8 perplexity {int8:.3f} vs fp32 {fp32:.3f}"
