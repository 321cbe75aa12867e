"""The lean Llama-family forward against transformers' modules: same logits, same fallbacks, swappable Linears.

Greedy tokens against `generate` through the engine, for both runners, are checked in test_engine.py.
"""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from scheduler import EngineConfig, SamplingParams, Sequence
from scheduler.model.llama import LeanLlama, build_lean_llama
from scheduler.model.runner import ModelRunner
from scheduler.planner import Chunk, StepPlan

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)


def tiny(model_cls, config_cls, seed: int = 0, **changes) -> torch.nn.Module:
    """A random-weight model of a small shape; biases and norms random too, so none of them hides."""
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**TINY, **changes})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(1.0 if "norm" in name else 0.0, 0.2)
    return model


def two_steps(runner: ModelRunner, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Step 1: the first prompt's first shard beside the whole second prompt. Step 2: the first prompt's
    rest beside the second's first decode (its next token given). Returns each step's logits."""
    first, second = (Sequence(list(p), SamplingParams()) for p in prompts)
    first.pages, second.pages = [5, 2, 7][:len(first.prompt_ids) // 16 + 1], [1, 4]
    split = len(first.prompt_ids) // 2
    step1 = runner.run(StepPlan([Chunk(first, 0, split), Chunk(second, 0, len(second.prompt_ids))]))
    second.output_ids.append(int(step1[0].argmax()))
    step2 = runner.run(StepPlan([Chunk(first, split, len(first.prompt_ids) - split),
                                 Chunk(second, len(second.prompt_ids), 1)]))
    return [step1, step2]


def expected(model: torch.nn.Module, prompts: list[list[int]], step1: torch.Tensor) -> list[torch.Tensor]:
    """The same logits from the model's own forward over each whole sequence."""
    with torch.inference_mode():
        def last(ids: list[int]) -> torch.Tensor:
            return model(torch.tensor([ids])).logits[0, -1]

        decoded = prompts[1] + [int(step1[0].argmax())]
        return [last(prompts[1])[None], torch.stack([last(prompts[0]), last(decoded)])]


def runners(model: torch.nn.Module) -> tuple[ModelRunner, ModelRunner]:
    lean = ModelRunner(model, EngineConfig(runner="lean", num_slabs=1))
    reference = ModelRunner(model, EngineConfig(runner="transformers", num_slabs=1))
    assert isinstance(lean.lean, LeanLlama) and reference.lean is None
    return lean, reference


def test_lean_logits_match_transformers_on_the_embedded_model(llm):
    model, tokenizer = llm
    prompts = [tokenizer("The lighthouse keeper climbed the stairs every evening, counting each step, "
                         "listening to the waves.")["input_ids"], tokenizer("Name three colors.")["input_ids"]]
    lean, reference = runners(model)
    got, ref = two_steps(lean, prompts), two_steps(reference, prompts)
    for lean_logits, ref_logits, own in zip(got, ref, expected(model, prompts, got[0]), strict=True):
        torch.testing.assert_close(lean_logits, ref_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lean_logits, own, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["llama-untied-linear-rope", "llama-llama3-rope-biased", "qwen2-yarn-rope",
                                  "mistral"])
def test_lean_logits_match_the_models_own_forward(kind: str):
    model = {
        "llama-untied-linear-rope": lambda: tiny(LlamaForCausalLM, LlamaConfig, tie_word_embeddings=False,
                                                 rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                  "rope_theta": 500.0}),
        "llama-llama3-rope-biased": lambda: tiny(
            LlamaForCausalLM, LlamaConfig, attention_bias=True, mlp_bias=True,
            rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
                             "rope_theta": 10000.0}),
        "qwen2-yarn-rope": lambda: tiny(Qwen2ForCausalLM, Qwen2Config, tie_word_embeddings=True,
                                        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                         "original_max_position_embeddings": 16}),
        "mistral": lambda: tiny(MistralForCausalLM, MistralConfig, sliding_window=None),
    }[kind]()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (40, 9)]
    lean, reference = runners(model)
    got, ref = two_steps(lean, prompts), two_steps(reference, prompts)
    for lean_logits, ref_logits, own in zip(got, ref, expected(model, prompts, got[0]), strict=True):
        torch.testing.assert_close(lean_logits, ref_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lean_logits, own, rtol=1e-4, atol=1e-4)


def converted_projection() -> torch.nn.Module:
    """A model whose projection was already swapped for another Linear-like module."""
    model = tiny(LlamaForCausalLM, LlamaConfig)

    class Converted(torch.nn.Linear):
        pass

    up = model.model.layers[1].mlp.up_proj
    model.model.layers[1].mlp.up_proj = Converted(up.in_features, up.out_features, bias=False)
    model.model.layers[1].mlp.up_proj.load_state_dict(up.state_dict())
    return model


@pytest.mark.parametrize("kind", ["dynamic-rope", "mistral-sliding-window", "gelu", "converted-projection"])
def test_models_the_lean_forward_cannot_compute_fall_back_to_transformers(kind: str):
    model = {
        "dynamic-rope": lambda: tiny(LlamaForCausalLM, LlamaConfig,
                                     rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
        "mistral-sliding-window": lambda: tiny(MistralForCausalLM, MistralConfig, sliding_window=32),
        "gelu": lambda: tiny(LlamaForCausalLM, LlamaConfig, hidden_act="gelu"),
        "converted-projection": converted_projection,
    }[kind]()
    runner = ModelRunner(model, EngineConfig(runner="lean", num_slabs=1))
    assert runner.lean is None
    prompts = [list(range(3, 23)), list(range(40, 47))]
    got = two_steps(runner, prompts)
    for logits, own in zip(got, expected(model, prompts, got[0]), strict=True):
        torch.testing.assert_close(logits, own, rtol=1e-4, atol=1e-4)


def test_lean_model_shares_the_weights_and_calls_its_linears_by_name():
    """A pass that swaps nn.Linear modules (weight quantization) must reach every projection."""
    model = tiny(LlamaForCausalLM, LlamaConfig, tie_word_embeddings=True)
    lean = build_lean_llama(model)
    attn = model.model.layers[0].self_attn
    assert attn.k_proj.weight.untyped_storage().data_ptr() == lean.layers[0].attn.qkv.weight.untyped_storage(
    ).data_ptr()
    assert lean.lm_head.weight is lean.embed.weight  # tied, as the checkpoint ties them
    calls: list[str] = []

    class Counting(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(self.name)
            return super().forward(x)

    for name, module in list(lean.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                swapped = Counting(child.in_features, child.out_features, bias=child.bias is not None)
                swapped.load_state_dict(child.state_dict())
                swapped.name = f"{name}.{child_name}".lstrip(".")
                setattr(module, child_name, swapped)
    runner = ModelRunner(model, EngineConfig(num_slabs=1))
    runner.lean = lean
    two_steps(runner, [list(range(3, 23)), list(range(40, 47))])
    per_step = {n for n in calls if n.startswith("layers.1.")} | {n for n in calls if not n.startswith("layers")}
    assert per_step == {"layers.1.attn.qkv", "layers.1.attn.o", "layers.1.mlp.gate_up", "layers.1.mlp.down",
                        "lm_head"}
    assert len(calls) == 2 * (4 * TINY["num_hidden_layers"] + 1)
