// The library as a Python module. Bound with pybind11 rather than registered as torch ops: a call through
// torch.ops parses its arguments against a schema, about 3 us a call here against 0.5 us this way, and a
// decode step makes some 270 of them. Each op lets go of the interpreter lock while it runs, as torch's own do.
#include <torch/extension.h>

#include <pybind11/stl.h>

#include "decode_layers.h"
#include "ops.h"

namespace py = pybind11;

PYBIND11_MODULE(voicepipe_cpu, m) {
  const auto unlocked = py::call_guard<py::gil_scoped_release>();
  m.def("int8_linear", &voicepipe::int8_linear, unlocked);
  m.def("int4_linear", &voicepipe::int4_linear, unlocked);
  m.def("rotary_write_kv", &voicepipe::rotary_write_kv, unlocked);
  m.def("decode_attention", &voicepipe::decode_attention, unlocked);
  m.def("rms_norm", &voicepipe::rms_norm, unlocked);
  m.def("silu_mul", &voicepipe::silu_mul, unlocked);
  py::class_<voicepipe::PackedLinear>(m, "PackedLinear")
      .def(py::init<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>, int64_t, int64_t>(), py::arg("w"),
           py::arg("scales"), py::arg("mins"), py::arg("bias"), py::arg("group"), py::arg("n"));
  py::class_<voicepipe::DecodeLayer>(m, "DecodeLayer")
      .def(py::init<at::Tensor, at::Tensor, voicepipe::PackedLinear, voicepipe::PackedLinear, voicepipe::PackedLinear,
                    voicepipe::PackedLinear>(),
           py::arg("attn_norm"), py::arg("mlp_norm"), py::arg("qkv"), py::arg("o"), py::arg("gate_up"), py::arg("down"));
  py::class_<voicepipe::DecodeLayers>(m, "DecodeLayers")
      .def(py::init<std::vector<voicepipe::DecodeLayer>, int64_t, double, double>(), py::arg("layers"),
           py::arg("n_heads"), py::arg("eps"), py::arg("scale"))
      .def("run", &voicepipe::DecodeLayers::run, unlocked);
}
