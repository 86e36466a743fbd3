// forgekit runtime, C++: a thin RAII wrapper over the C API (forgekit_runtime.h); errors become
// forgekit::Error exceptions carrying the status code (forgekit's exit codes) and the one-line message.
//
//   forgekit::Model model("out/");                       // or Model("sealed/", "modelKey.bin", password)
//   model.set_input(0, pixels.data(), {1, 3, 224, 224}); // dtype from the element type (float -> float32)
//   model.run();
//   std::vector<float> probs = model.output_as<float>(0);
//
//   forgekit::Model gpu("out_cuda/", forgekit::Device::cuda(0));  // or Device::parse("cuda:1"); default: the
//                                                                  // device metadata.json names
#ifndef FORGEKIT_RUNTIME_HPP_
#define FORGEKIT_RUNTIME_HPP_

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "forgekit_runtime.h"

namespace forgekit {

class Error : public std::runtime_error {
 public:
  Error(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }  // an fk_status: forgekit's exit code for this kind of failure

 private:
  int code_;
};

inline void check(int status) {
  if (status != FK_OK) throw Error(status, fk_last_error());
}

struct TensorInfo {
  std::string name, dtype, layout;
  std::vector<int64_t> shape;  // -1 for dynamic dims
  std::vector<std::string> dim_names;  // "" for static dims
  std::vector<int64_t> dim_min, dim_max, dim_step;  // dim_max -1: unbounded
};

// Where a model runs (fk_device_kind and id); Device() is the artifact's own device.
struct Device {
  int32_t kind = FK_DEVICE_DEFAULT;
  int32_t id = 0;

  static Device cpu() { return {FK_DEVICE_CPU, 0}; }
  static Device cuda(int32_t id = 0) { return {FK_DEVICE_CUDA, id}; }
  // "cpu", "cuda", "cuda:N" ("" or "default": the artifact's)
  static Device parse(const std::string& text) {
    Device device;
    check(fk_parse_device(text.c_str(), &device.kind, &device.id));
    return device;
  }
  std::string str() const {
    return kind == FK_DEVICE_CPU ? "cpu" : kind == FK_DEVICE_CUDA ? "cuda:" + std::to_string(id) : "default";
  }
};

// numpy's dtype name of a C++ element type.
template <typename T> constexpr const char* dtype_of();
template <> constexpr const char* dtype_of<float>() { return "float32"; }
template <> constexpr const char* dtype_of<double>() { return "float64"; }
template <> constexpr const char* dtype_of<int64_t>() { return "int64"; }
template <> constexpr const char* dtype_of<int32_t>() { return "int32"; }
template <> constexpr const char* dtype_of<int16_t>() { return "int16"; }
template <> constexpr const char* dtype_of<int8_t>() { return "int8"; }
template <> constexpr const char* dtype_of<uint8_t>() { return "uint8"; }
template <> constexpr const char* dtype_of<bool>() { return "bool"; }

class Model {
 public:
  explicit Model(const std::string& path, const char* key_file = nullptr, const char* password = nullptr) {
    check(fk_open(path.c_str(), key_file, password, &model_, nullptr, 0));
  }
  // On a chosen device (a CUDA artifact on the GPU needs libtvm_runtime_cuda.so, libcudart.so.13 and the driver).
  Model(const std::string& path, Device device, const char* key_file = nullptr, const char* password = nullptr) {
    fk_open_options options;
    fk_open_options_init(&options);
    options.key_file = key_file;
    options.password = password;
    options.device_kind = device.kind;
    options.device_id = device.id;
    check(fk_open_ex(path.c_str(), &options, &model_, nullptr, 0));
  }
  ~Model() { fk_close(model_); }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  Model(Model&& other) noexcept : model_(std::exchange(other.model_, nullptr)) {}
  Model& operator=(Model&& other) noexcept {
    std::swap(model_, other.model_);
    return *this;
  }

  int num_inputs() const { return fk_num_inputs(model_); }
  int num_outputs() const { return fk_num_outputs(model_); }
  int input_index(const std::string& name) const {
    int index = fk_input_index(model_, name.c_str());
    if (index < 0) throw Error(FK_ERR_INPUT, "The model has no input named '" + name + "'.");
    return index;
  }
  TensorInfo input_info(int index) const { return describe(fk_input_info, index); }
  TensorInfo output_info(int index) const { return describe(fk_output_info, index); }
  std::string level() const { return fk_level(model_); }
  Device device() const {
    Device device;
    check(fk_model_device(model_, &device.kind, &device.id));
    return device;
  }

  void set_input(int index, const void* data, const std::string& dtype, const std::vector<int64_t>& shape) {
    check(fk_set_input(model_, index, data, dtype.c_str(), shape.data(), static_cast<int32_t>(shape.size())));
  }
  template <typename T>
  void set_input(int index, const T* data, const std::vector<int64_t>& shape) {
    set_input(index, data, dtype_of<T>(), shape);
  }
  template <typename T>
  void set_input(const std::string& name, const T* data, const std::vector<int64_t>& shape) {
    set_input(input_index(name), data, dtype_of<T>(), shape);
  }
  // GPU memory (or, for a CPU model, host memory) the model reads in place: see fk_set_input_device.
  void set_input_device(int index, void* data, const std::string& dtype, const std::vector<int64_t>& shape) {
    check(fk_set_input_device(model_, index, data, dtype.c_str(), shape.data(), static_cast<int32_t>(shape.size())));
  }
  void run() { check(fk_run(model_)); }

  // The output of the last run(); its data stays valid until the next run() or the Model's end.
  fk_tensor output(int index) const {
    fk_tensor out;
    check(fk_get_output(model_, index, &out));
    return out;
  }
  // The output where the model computed it (a CUDA device pointer for a CUDA model), without a copy.
  fk_tensor output_device(int index) const {
    fk_tensor out;
    check(fk_get_output_device(model_, index, &out));
    return out;
  }
  std::vector<int64_t> output_shape(int index) const {
    fk_tensor out = output(index);
    return std::vector<int64_t>(out.shape, out.shape + out.ndim);
  }
  template <typename T>
  std::vector<T> output_as(int index) const {
    fk_tensor out = output(index);
    if (std::strcmp(out.dtype, dtype_of<T>()) != 0) {
      throw Error(FK_ERR_USAGE,
                  "Output " + std::to_string(index) + " is " + out.dtype + ", not " + dtype_of<T>() + ".");
    }
    std::vector<T> values(out.nbytes / sizeof(T));
    std::memcpy(values.data(), out.data, out.nbytes);
    return values;
  }

  fk_model* handle() const { return model_; }

 private:
  template <typename F>
  TensorInfo describe(F query, int index) const {
    fk_tensor_info raw;
    check(query(model_, index, &raw));
    TensorInfo info{raw.name, raw.dtype, raw.layout, {}, {}, {}, {}, {}};
    for (int32_t i = 0; i < raw.ndim; ++i) {
      info.shape.push_back(raw.shape[i]);
      info.dim_names.push_back(raw.dim_names[i] ? raw.dim_names[i] : "");
      info.dim_min.push_back(raw.dim_min[i]);
      info.dim_max.push_back(raw.dim_max[i]);
      info.dim_step.push_back(raw.dim_step[i]);
    }
    return info;
  }

  fk_model* model_ = nullptr;
};

}  // namespace forgekit

#endif  // FORGEKIT_RUNTIME_HPP_
