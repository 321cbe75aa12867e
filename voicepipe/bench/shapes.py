"""Named shapes of Llama-family models, and a tokenizer without a vocabulary for models that have none.

Plain data, importable without torch: the command line lists the shapes before anything loads.
"""

# "default" is the embedded SmolLM2-135M-Instruct's shape (its config, checked by the tests); "1b" a
# Llama-3.2-1B-like shape; "13b" Llama-2-13B's; "tiny" a few small layers for CPU tests.
SHAPES: dict[str, dict] = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048, tie_word_embeddings=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "default": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
                    rms_norm_eps=1e-5, tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072,
               rms_norm_eps=1e-5, tie_word_embeddings=True,
               rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192}),
    "13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
                num_key_value_heads=40, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
                tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
}


class IdTokenizer:
    """A tokenizer without a vocabulary: text is token ids written out, so any id decodes and streams."""

    def __init__(self, vocab_size: int, eos_token_id: int = 2):
        self.vocab_size, self.eos_token_id, self.pad_token_id = vocab_size, eos_token_id, 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [int(word) for word in text.split()]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(f" {int(i)}" for i in ids)
