"""The analytic cost of a step: `overhead + max(FLOPs / (MFU * peak), bytes / (MBU * bandwidth))`.

This is BLIS's roofline step model (llm-d's inference simulator), applied to the step as a whole: the
weights are read once a step whatever its batch, each chunk reads its context's keys and values once and
writes its own, the layers' products cost 2 FLOPs per weight per token, the output head only for rows that
sample, and attention 4 FLOPs per (query, key) pair per head dimension (QK^T and PV). Activations, norms
and the embedding lookup are left out: under 1% of either side for the shapes here.

Checked against public measurements: LMDeploy's Llama-2-13B fp16 table on one A100-80G (TurboMind v0.2.0,
docs/en/benchmark/a100_fp16.md) gives 17 ms a decode step at batch 1, 19-24 ms at batch 16-64 with short
contexts, and 242 ms for a 2,048-token prompt; `voicepipe.simulate.public` compares this model with every
row of that table that fits in memory.
"""

from dataclasses import dataclass

from scheduler.sim.devices import KV_ITEMSIZE, Device, DType
from scheduler.sim.shape import ModelShape
from scheduler.step_shape import StepShape


@dataclass(frozen=True, slots=True)
class Efficiency:
    """The fractions of peak real kernels reach, and the fixed cost of a step.

    Defaults and their ranges:
    - mbu 0.70 (0.64-0.76): measured point, LMDeploy's 13B batch-1 decode, 0.75 (26.0 GB of fp16 weights in
      17 ms on 2,039 GB/s); the band below it is assumed;
    - mfu 0.68 (0.62-0.74): measured point, LMDeploy's 2,048-token 13B first token in 242 ms, 0.71 of 312
      TFLOPS by this module's count (0.77 without its decode step); the band around it is assumed;
    - overhead 1 ms (0.5-3 ms): launch and host work a step does not hide (CUDA graphs for decode, host
      planning overlapped with the device, as the engine does on CUDA). Not measured on a GPU here.
    """

    mfu: float = 0.68
    mbu: float = 0.70
    overhead_s: float = 1e-3

    @classmethod
    def band(cls) -> dict[str, "Efficiency"]:
        """The central estimate and the two ends of its range (the slow end: low fractions, high overhead)."""
        return {"low": cls(0.62, 0.64, 3e-3), "central": cls(), "high": cls(0.74, 0.76, 0.5e-3)}


class Roofline:
    """Step prices for one model in one weight format on one device."""

    def __init__(self, shape: ModelShape, device: Device, dtype: DType, efficiency: Efficiency | None = None):
        self.shape, self.device, self.dtype = shape, device, dtype
        self.efficiency = efficiency or Efficiency()
        self.kv_per_token = shape.kv_bytes_per_token(KV_ITEMSIZE)

    @property
    def weight_bytes(self) -> float:
        """What one step reads of the weights: every matrix once (the embedding lookup is a few rows)."""
        return (self.shape.linear_params + self.shape.head_params) * self.dtype.weight_bytes

    def parts(self, step: StepShape) -> dict[str, float]:
        """FLOPs, bytes, and the seconds each side of the roofline would take."""
        s, e, d = self.shape, self.efficiency, self.device
        linear_flops = 2.0 * step.tokens * s.linear_params + 2.0 * step.samples * s.head_params
        attention_flops = 4.0 * s.layers * s.heads * s.head_dim * step.attention_pairs
        kv_bytes = float(step.context_tokens + step.tokens) * self.kv_per_token
        compute_s = linear_flops / (e.mfu * d.peak[self.dtype.gemm]) + attention_flops / (e.mfu * d.peak["fp16"])
        memory_s = (self.weight_bytes + kv_bytes) / (e.mbu * d.bandwidth)
        return {"linear_flops": linear_flops, "attention_flops": attention_flops, "weight_bytes": self.weight_bytes,
                "kv_bytes": kv_bytes, "compute_s": compute_s, "memory_s": memory_s,
                "seconds": e.overhead_s + max(compute_s, memory_s)}

    def step_seconds(self, step: StepShape) -> float:
        return self.parts(step)["seconds"]

    def kv_capacity_bytes(self, utilization: float = 0.9, workspace_bytes: float = 2e9) -> float:
        """Device memory left for the KV cache: a share of it (vLLM's default gpu_memory_utilization is 0.9)
        less the weights and a workspace for activations (assumed 2 GB)."""
        weights = self.shape.params * self.dtype.weight_bytes
        return utilization * self.device.memory_bytes - weights - workspace_bytes

    def describe(self) -> dict:
        return {"model": self.shape.name, "device": self.device.name, "dtype": self.dtype.name,
                "mfu": self.efficiency.mfu, "mbu": self.efficiency.mbu, "overhead_s": self.efficiency.overhead_s,
                "source": self.device.source}
