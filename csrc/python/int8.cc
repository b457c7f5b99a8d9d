// zrl._core.int8_layer and int8_layer_kernels (csrc/kernels/int8_gemm.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "kernels/int8_gemm.h"
#include "python/bindings.h"
#include "python/numpy_args.h"

namespace py = pybind11;

namespace zrl::python {
namespace {

// The kernel an int8_layer `kernel` argument names: "auto" (the fastest this CPU runs), or one by name, for tests
// ("avx512_vnni", "avx2", "portable"; a ValueError where it cannot run).
zrl::Int8Kernel int8_kernel_named(const std::string& name) {
  if (name == "auto") return zrl::Int8Kernel::kAuto;
  for (zrl::Int8Kernel k : zrl::kInt8Kernels) {
    if (name != zrl::int8_kernel_name(k)) continue;
    if (!zrl::int8_kernel_runs(k)) throw py::value_error("int8_layer: the " + name + " kernel does not run on this CPU");
    return k;
  }
  throw py::value_error("int8_layer: kernel must be auto, avx512_vnni, avx2 or portable, got " + name);
}

// The kernels this CPU runs, fastest first (the first is the one "auto" picks).
py::list int8_layer_kernels() {
  py::list out;
  for (zrl::Int8Kernel k : zrl::kInt8Kernels)
    if (zrl::int8_kernel_runs(k)) out.append(zrl::int8_kernel_name(k));
  return out;
}

// One int8 layer (see csrc/kernels/int8_gemm.h): x uint8 (any shape, C-contiguous), base int64 [P], w int8
// [OC / 16, J, 64] (blocks of 16 outputs x 4 bytes per run), offs int32 [J], scale and bias float32 [OC], out uint8 or float32 [P, OC]. Every
// run base[p] + offs[j] .. + 4 must lie inside x (checked; the kernel then runs without the
// GIL, so base and offs must not change under it). kernel: see int8_kernel_named.
void int8_layer(const py::handle& x_obj, const py::handle& base_obj, const py::handle& w_obj, const py::handle& offs_obj,
                const py::handle& scale_obj, const py::handle& bias_obj, float inv_out_scale, int qmax,
                const py::handle& out_obj, const std::string& kernel) {
  auto arr = [](const py::handle& h, const char* name) {
    if (!py::isinstance<py::array>(h)) throw py::value_error(std::string("int8_layer: ") + name + " must be a numpy array");
    auto a = py::reinterpret_borrow<py::array>(h);
    if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string("int8_layer: ") + name + " must be C-contiguous");
    require_aligned(a, name);
    return a;
  };
  auto x = arr(x_obj, "x"), base = arr(base_obj, "base"), w = arr(w_obj, "w"), offs = arr(offs_obj, "offs");
  auto scale = arr(scale_obj, "scale"), bias = arr(bias_obj, "bias"), out = arr(out_obj, "out");
  auto want = [](const py::array& a, const py::dtype& dt, const char* name) {
    if (!is_dtype(a.dtype(), dt)) throw py::value_error(std::string("int8_layer: ") + name + " has dtype " + std::string(py::str(a.dtype())));
  };
  want(x, py::dtype::of<std::uint8_t>(), "x");
  want(base, py::dtype::of<std::int64_t>(), "base");
  want(w, py::dtype::of<std::int8_t>(), "w");
  want(offs, py::dtype::of<std::int32_t>(), "offs");
  want(scale, py::dtype::of<float>(), "scale");
  want(bias, py::dtype::of<float>(), "bias");
  const bool u8 = is_dtype(out.dtype(), py::dtype::of<std::uint8_t>());
  if (!u8 && !is_dtype(out.dtype(), py::dtype::of<float>())) throw py::value_error("int8_layer: out must be uint8 or float32");
  if (w.ndim() != 3 || w.shape(2) != 64 || base.ndim() != 1 || offs.ndim() != 1 || offs.shape(0) != w.shape(1))
    throw py::value_error("int8_layer: expected w [OC / 16, J, 64], base [P] and offs [J]");
  const py::ssize_t P = base.shape(0), J = w.shape(1), OC = 16 * w.shape(0);
  if (scale.ndim() != 1 || scale.shape(0) != OC || bias.ndim() != 1 || bias.shape(0) != OC)
    throw py::value_error("int8_layer: scale and bias must be [OC]");
  if (out.ndim() != 2 || out.shape(0) != P || out.shape(1) != OC)
    throw py::value_error("int8_layer: out must be [" + std::to_string(P) + ", " + std::to_string(OC) + "]");
  if (!out.writeable()) throw py::value_error("int8_layer: out must be writable");
  if (u8 && (qmax < 0 || qmax > 255)) throw py::value_error("int8_layer: qmax must be in [0, 255]");
  const auto* b = static_cast<const std::int64_t*>(base.data());
  const auto* o = static_cast<const std::int32_t*>(offs.data());
  if (static_cast<std::size_t>(J) > zrl::kInt8LayerMaxJ)
    throw py::value_error("int8_layer: J " + std::to_string(J) + " > " + std::to_string(zrl::kInt8LayerMaxJ) +
                          ": the int32 sums could overflow");
  if (!zrl::int8_runs_inside(b, static_cast<std::size_t>(P), o, static_cast<std::size_t>(J),
                             static_cast<std::size_t>(x.size())))
    throw py::value_error("int8_layer: base + offs reach outside x");
  const zrl::Int8Layer layer{static_cast<const std::int8_t*>(w.data()), static_cast<std::size_t>(J), static_cast<std::size_t>(OC), o,
                             static_cast<const float*>(scale.data()), static_cast<const float*>(bias.data())};
  const auto* xp = static_cast<const std::uint8_t*>(x.data());
  auto* out_u8 = u8 ? static_cast<std::uint8_t*>(out.mutable_data()) : nullptr;
  auto* out_f32 = u8 ? nullptr : static_cast<float*>(out.mutable_data());
  const zrl::Int8Kernel k = int8_kernel_named(kernel);
  py::gil_scoped_release release;
  zrl::int8_layer(xp, b, static_cast<std::size_t>(P), layer, inv_out_scale, qmax, out_u8, out_f32, k);
}

}  // namespace

void bind_int8(py::module_& m) {
  m.def("int8_layer", &int8_layer, py::arg("x"), py::arg("base"), py::arg("w"), py::arg("offs"), py::arg("scale"),
        py::arg("bias"), py::arg("inv_out_scale"), py::arg("qmax"), py::arg("out"), py::arg("kernel") = "auto",
        "One int8 layer of an actor's policy (a convolution without padding, or an FC): for p < P and oc < OC, "
        "acc = sum over j, q < 4 of x[base[p] + offs[j] + q] * w[j, oc, q] (uint8 x int8), y = acc * scale[oc] + bias[oc]; "
        "out uint8: clamp(round-half-even(y * inv_out_scale), 0, qmax); out float32: max(y, 0). AVX-512 VNNI or AVX2 where the "
        "CPU has it (int8_layer_kernels; AVX2 sums pairs of products in saturating int16: keep |w| <= 63 for x up to 255); "
        "kernel names one for tests. "
        "Releases the GIL.");
  m.def("int8_layer_kernels", &int8_layer_kernels,
        "The kernels int8_layer runs on this CPU, fastest first (the first is the one it picks): 'avx512_vnni' (exact "
        "for any int8 weights), 'avx2' (pairs of products in saturating int16), 'portable'.");
}

}  // namespace zrl::python
