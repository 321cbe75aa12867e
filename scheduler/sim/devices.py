"""Published rates of the GPUs the simulator prices steps on, and the weight formats it knows.

Every figure is the vendor's dense (no 2:4 sparsity) peak for the SXM part:
- A100-80G: NVIDIA A100 Tensor Core GPU datasheet (2021): 80 GB HBM2e, 2,039 GB/s; FP16 tensor 312 TFLOPS,
  INT8 tensor 624 TOPS (the datasheet's 624 / 1,248 are with sparsity).
- H100 SXM: NVIDIA H100 Tensor Core GPU datasheet (2022): 80 GB HBM3, 3.35 TB/s; FP16 tensor 989 TFLOPS,
  INT8 tensor 1,979 TOPS (the datasheet prints 1,979 / 3,958 "with sparsity"; dense is half).
- H200 SXM: NVIDIA H200 datasheet (2023): 141 GB HBM3e, 4.8 TB/s; the same Hopper compute as the H100 SXM.
Peaks are what no kernel reaches; `roofline.Efficiency` holds the fractions real kernels get, with sources.
"""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    memory_bytes: float
    bandwidth: float  # bytes per second, peak
    peak: dict[str, float]  # operations per second by GEMM kind ("fp16", "int8"), dense peak
    source: str


@dataclass(frozen=True, slots=True)
class DType:
    """How a model's weights are stored and multiplied. The KV cache stays 2-byte (fp16) in every format."""

    name: str
    weight_bytes: float
    gemm: str  # which of the device's peaks its matrix products run at
    about: str


DEVICES = {
    "a100-80g": Device("a100-80g", 80e9, 2.039e12, {"fp16": 312e12, "int8": 624e12},
                       "NVIDIA A100 datasheet: 2,039 GB/s, 312 TFLOPS FP16, 624 TOPS INT8 (dense)"),
    "h100": Device("h100", 80e9, 3.35e12, {"fp16": 989e12, "int8": 1979e12},
                   "NVIDIA H100 SXM datasheet: 3.35 TB/s, 989 TFLOPS FP16, 1,979 TOPS INT8 (dense)"),
    "h200": Device("h200", 141e9, 4.8e12, {"fp16": 989e12, "int8": 1979e12},
                   "NVIDIA H200 SXM datasheet: 141 GB, 4.8 TB/s, Hopper compute as the H100 SXM"),
}

DTYPES = {
    "fp16": DType("fp16", 2, "fp16", "16-bit weights and activations"),
    # The seed article's "INT8 weight quantization", taken at its most favourable: int8 weights and int8
    # activations (SmoothQuant-style W8A8), so prefill runs at the INT8 tensor peak.
    "int8": DType("int8", 1, "int8", "W8A8: int8 weights and activations, INT8 tensor cores"),
    # Weight-only int8 (W8A16): half the bytes a decode reads, but the products run at the FP16 peak.
    "w8a16": DType("w8a16", 1, "fp16", "int8 weights dequantized into FP16 products"),
}
KV_ITEMSIZE = 2  # fp16 keys and values
