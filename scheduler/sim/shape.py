"""A Llama-family model as a cost model sees it: its widths and counts, and what a token costs in it."""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The numbers that set a step's FLOPs and bytes (the weights' values do not matter)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False  # the output head shares the embedding's weights (read once a step either way)
    max_positions: int = 1 << 30

    @classmethod
    def from_config(cls, name: str, config: dict[str, Any]) -> "ModelShape":
        """From a transformers Llama config's fields (as `voicepipe.bench.shapes.SHAPES` holds them)."""
        heads = config["num_attention_heads"]
        return cls(name, config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"], heads,
                   config.get("num_key_value_heads", heads), config.get("head_dim") or config["hidden_size"] // heads,
                   config["vocab_size"], bool(config.get("tie_word_embeddings", False)),
                   config.get("max_position_embeddings", 1 << 30))

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer's matrices: q and o (heads), k and v (kv heads), the gated MLP."""
        attention = 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
        return attention + 3 * self.hidden * self.intermediate

    @property
    def linear_params(self) -> int:
        """Weights every token goes through (the layers' matrices; norms are too small to count)."""
        return self.layers * self.layer_params

    @property
    def head_params(self) -> int:
        """The output head (vocab x hidden): only rows that sample a token go through it."""
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """All weights, the embedding counted once more unless the head shares it."""
        return self.linear_params + self.head_params * (1 if self.tied else 2)

    def kv_bytes_per_token(self, itemsize: int) -> int:
        """Keys and values of one token over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize
