// metadata.json -> forgekit::Metadata, with tvm_ffi's JSON parser (already linked: no extra dependency).
#include <fstream>
#include <optional>
#include <sstream>
#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/string.h>

#include "../include/forgekit_runtime.h"
#include "internal.h"

namespace forgekit {
namespace {

namespace json = tvm::ffi::json;
using tvm::ffi::Any;
using tvm::ffi::String;

std::optional<Any> Field(const Any& obj, const char* key) {
  auto map = obj.try_cast<json::Object>();
  if (!map) return std::nullopt;
  auto it = map->find(Any(String(key)));
  if (it == map->end() || (*it).second == nullptr) return std::nullopt;
  return (*it).second;
}

std::string Str(const Any& obj, const char* key, const std::string& fallback = "") {
  auto value = Field(obj, key);
  if (!value) return fallback;
  auto text = value->try_cast<String>();
  return text ? std::string(*text) : fallback;
}

std::optional<int64_t> Int(const Any& obj, const char* key) {
  auto value = Field(obj, key);
  if (!value || value->type_index() != tvm::ffi::TypeIndex::kTVMFFIInt) return std::nullopt;
  return value->cast<int64_t>();
}

json::Array Arr(const Any& obj, const char* key) {
  auto value = Field(obj, key);
  if (!value) return json::Array();
  auto array = value->try_cast<json::Array>();
  return array ? *array : json::Array();
}

std::vector<std::string> Strings(const Any& obj, const char* key) {
  std::vector<std::string> out;
  for (const Any& item : Arr(obj, key)) {
    if (auto text = item.try_cast<String>()) out.emplace_back(*text);
  }
  return out;
}

// Static dims are ints, dynamic ones the symbol's name; their ranges come from model.dynamic.
TensorSpec ParseTensor(const Any& spec, const Any& dynamic, const std::string& where) {
  TensorSpec t;
  t.name = Str(spec, "name");
  t.dtype = Str(spec, "dtype");
  if (t.name.empty() || t.dtype.empty() || !Field(spec, "shape")) {
    throw Failure(FK_ERR_ARTIFACT,
                  where + " has an input/output without name, dtype or shape: recompile the artifact.");
  }
  for (const Any& dim : Arr(spec, "shape")) {
    if (dim.type_index() == tvm::ffi::TypeIndex::kTVMFFIInt) {
      int64_t n = dim.cast<int64_t>();
      t.shape.push_back(n);
      t.dim_min.push_back(n);
      t.dim_max.push_back(n);
      t.dim_step.push_back(1);
      t.symbols.emplace_back();
      continue;
    }
    auto symbol = dim.try_cast<String>();
    std::string name = symbol ? std::string(*symbol) : "?";
    auto bounds = Field(dynamic, name.c_str());
    t.shape.push_back(-1);
    t.symbols.push_back(name);
    t.dim_min.push_back(bounds ? Int(*bounds, "min").value_or(1) : 1);
    t.dim_max.push_back(bounds ? Int(*bounds, "max").value_or(-1) : -1);
    t.dim_step.push_back(bounds ? Int(*bounds, "step").value_or(1) : 1);
  }
  for (const std::string& s : t.symbols) t.symbol_ptrs.push_back(s.empty() ? nullptr : s.c_str());
  return t;
}

}  // namespace

Metadata ReadMetadata(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Failure(FK_ERR_ARTIFACT, "'" + path + "' cannot be read: is it a forgekit artifact directory?");
  std::stringstream text;
  text << file.rdbuf();
  String error;
  Any root = json::Parse(String(text.str()), &error);
  if (!error.empty() || !root.try_cast<json::Object>()) {
    throw Failure(FK_ERR_ARTIFACT, "'" + path + "' is not readable JSON (" + std::string(error) +
                                       "): recompile the artifact.");
  }
  Metadata meta;
  Any model = Field(root, "model").value_or(Any());
  Any build = Field(root, "build").value_or(Any());
  Any library = Field(root, "library").value_or(Any());
  Any dynamic = Field(model, "dynamic").value_or(Any());
  meta.layout = Str(model, "layout");
  for (const Any& spec : Arr(model, "inputs")) meta.inputs.push_back(ParseTensor(spec, dynamic, "'" + path + "'"));
  for (const Any& spec : Arr(model, "outputs")) meta.outputs.push_back(ParseTensor(spec, dynamic, "'" + path + "'"));
  meta.library_file = Str(library, "file", "model_library.so");
  meta.library_size = Int(library, "size").value_or(-1);
  meta.library_sha256 = Str(library, "sha256");
  for (const Any& entry : Arr(library, "variants")) {
    meta.variants.push_back({Str(entry, "name"), Str(entry, "file"), Strings(entry, "cpu_features"),
                             Int(entry, "size").value_or(-1), Str(entry, "sha256")});
  }
  if (auto weights = Field(library, "weights")) {
    meta.weights_file = Str(*weights, "file");
    meta.weights_sha256 = Str(*weights, "sha256");
  }
  meta.arch = Str(build, "arch");
  meta.cpu = Str(build, "cpu");
  meta.target_name = Str(build, "target_name");
  meta.cpu_features = Strings(build, "cpu_features");
  if (auto device = Field(build, "device")) {
    meta.device_os = Str(*device, "os", "linux");
    meta.device_kind = Str(*device, "kind", "cpu");
    meta.gpu_arch = Str(*device, "gpu_arch");
    meta.gpu_generation = Str(*device, "gpu_generation");
    meta.cuda = Str(*device, "cuda");
    meta.min_driver = Str(*device, "min_driver");
  } else {  // artifacts older than build.device: derived from the family, as forgekit.artifact.layout does
    std::string family = Str(build, "family");
    meta.device_os = family == "android" ? "android" : "linux";
    meta.device_kind = family == "cuda" ? "cuda" : "cpu";
  }
  if (meta.gpu_arch.empty()) meta.gpu_arch = Str(build, "gpu_arch");  // older CUDA artifacts record it here
  return meta;
}

}  // namespace forgekit
