// The forgekit runtime C API over the TVM runtime (what forgekit/runtime/engine.py does, in C++): load the
// model library as a tvm::ffi::Module, make its Relax VM (vm_load_executable, vm_initialization) and call
// its "main" on tvm::ffi::Tensors.
#include "../include/forgekit_runtime.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <climits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <vector>

#include "internal.h"

namespace forgekit {

std::string JoinPath(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

namespace {

thread_local std::string g_last_error;
// how the message of a refused index starts (forgekit.errors.INDEX_ERROR_MARKER)
const char kIndexErrorMarker[] = "Index out of range";

struct DtypeName {
  const char* name;
  DLDataType type;
};
const DtypeName kDtypes[] = {
    {"float32", {kDLFloat, 32, 1}}, {"float16", {kDLFloat, 16, 1}}, {"float64", {kDLFloat, 64, 1}},
    {"bfloat16", {kDLBfloat, 16, 1}}, {"int8", {kDLInt, 8, 1}},     {"int16", {kDLInt, 16, 1}},
    {"int32", {kDLInt, 32, 1}},     {"int64", {kDLInt, 64, 1}},     {"uint8", {kDLUInt, 8, 1}},
    {"uint16", {kDLUInt, 16, 1}},   {"uint32", {kDLUInt, 32, 1}},   {"uint64", {kDLUInt, 64, 1}},
    {"bool", {kDLBool, 8, 1}},
};

const DtypeName* FindDtype(const std::string& name) {
  for (const DtypeName& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const char* DtypeOf(DLDataType t) {
  for (const DtypeName& d : kDtypes) {
    if (d.type.code == t.code && d.type.bits == t.bits && d.type.lanes == t.lanes) return d.name;
  }
  return "unknown";
}

// TVM's kernels assume 64-byte aligned buffers; an unaligned one crashes without a message.
struct AlignedAlloc {
  void AllocData(DLTensor* t) {
    size_t bytes = tvm::ffi::GetDataSize(*t);
    if (posix_memalign(&t->data, 64, bytes ? bytes : 64) != 0) t->data = nullptr;
  }
  void FreeData(DLTensor* t) { free(t->data); }
};

std::string Shape(const std::vector<int64_t>& shape, const std::vector<std::string>* symbols = nullptr) {
  std::string out;
  for (size_t i = 0; i < shape.size(); ++i) {
    out += (i ? "x" : "") + (shape[i] < 0 && symbols ? (*symbols)[i] : std::to_string(shape[i]));
  }
  return out.empty() ? "scalar" : out;
}

std::string FirstLine(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  return line.empty() ? "unknown error" : line;
}

// The model library refers to libtvm_ffi's C symbols; when this library was itself dlopen()ed with
// RTLD_LOCAL (ctypes, JNI, a plugin host) they are invisible to it.  Re-opening both TVM libraries with
// RTLD_GLOBAL | RTLD_NOLOAD makes them global without loading anything new.
void PromoteTvmLibraries() {
  for (void* symbol : {reinterpret_cast<void*>(&TVMFFIFunctionGetGlobal),
                       dlsym(RTLD_DEFAULT, "TVMBackendAllocWorkspace")}) {
    Dl_info info;
    if (symbol && dladdr(symbol, &info) && info.dli_fname) dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  }
}

// glibc's dlopen returns an already-loaded object when the path string matches one loaded before, so each
// memfd load spells /proc/self/fd/N differently ("./" and ".//" segments for the bits of a counter).
std::string FdPath(int fd) {
  static std::atomic<unsigned> counter{0};
  unsigned n = counter++;
  std::string segments;
  do {
    segments.insert(0, (n & 1) ? ".//" : "./");
    n >>= 1;
  } while (n);
  return "/proc/self/fd/" + segments + std::to_string(fd);
}

}  // namespace

// A sealed anonymous memory file holding a copy of the file at `path` (caller closes it).
int CopyToMemfd(const std::string& path) {
  int in = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) throw Failure(FK_ERR_ARTIFACT, "Cannot read '" + path + "': check its permissions.");
  int fd = memfd_create("forgekit-model", MFD_CLOEXEC);
  char block[1 << 16];
  ssize_t got = 0;
  while (fd >= 0 && (got = read(in, block, sizeof block)) > 0) {
    for (ssize_t done = 0; done < got;) {
      ssize_t wrote = write(fd, block + done, static_cast<size_t>(got - done));
      if (wrote <= 0) {
        got = -1;
        break;
      }
      done += wrote;
    }
    if (got < 0) break;
  }
  close(in);
  if (fd < 0 || got < 0) {
    if (fd >= 0) close(fd);
    throw Failure(FK_ERR_ARTIFACT, "Cannot copy '" + path + "' into memory to load it again.");
  }
  return fd;
}

// glibc's dlopen also returns the object loaded before under the same path when the file there was replaced
// since (an artifact recompiled in place): each file identity (device, inode, size, mtime) seen at a path gets
// its own spelling, "dir/./name", "dir/././name"... (a portable level still finds its weights next to it).
std::string LoadPath(const std::string& library) {
  static std::mutex lock;
  static std::map<std::string, std::map<std::vector<int64_t>, std::string>> spellings;
  char resolved[PATH_MAX];
  std::string real = realpath(library.c_str(), resolved) ? resolved : library;
  struct stat st;
  if (stat(real.c_str(), &st) != 0) return library;
  std::vector<int64_t> id = {static_cast<int64_t>(st.st_dev), static_cast<int64_t>(st.st_ino),
                             static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
                             static_cast<int64_t>(st.st_mtim.tv_nsec)};
  std::lock_guard<std::mutex> guard(lock);
  auto& seen = spellings[real];
  auto found = seen.find(id);
  if (found != seen.end()) return found->second;
  for (const auto& entry : seen) {
    // the same inode with other bytes (cp onto it): dlopen would hand back the old code under any name
    if (entry.first[0] == id[0] && entry.first[1] == id[1]) return "";
  }
  size_t slash = real.find_last_of('/');
  std::string dots;
  for (size_t i = 0; i < seen.size(); ++i) dots += "./";
  return seen[id] = real.substr(0, slash + 1) + dots + real.substr(slash + 1);
}

namespace {

tvm::ffi::Module LoadLibrary(const std::string& path) {
  // Not Module::LoadFromFile: it picks the loader from the extension, and a memfd path has none.
  static tvm::ffi::Function loader = tvm::ffi::Function::GetGlobalRequired("ffi.Module.load_from_file.so");
  return loader(path, "so").cast<tvm::ffi::Module>();
}

void Flatten(const tvm::ffi::Any& value, std::vector<tvm::ffi::Tensor>* out) {
  if (auto tensor = value.try_cast<tvm::ffi::Tensor>()) {
    out->push_back(*tensor);
  } else if (auto items = value.try_cast<tvm::ffi::Array<tvm::ffi::Any>>()) {
    for (const tvm::ffi::Any& item : *items) Flatten(item, out);
  } else {
    throw Failure(FK_ERR_RUNTIME, std::string("The model returned a ") + value.GetTypeKey() +
                                      ", not tensors: this runtime returns tensor outputs only.");
  }
}

}  // namespace
}  // namespace forgekit

using forgekit::Failure;

struct fk_model {
  forgekit::Metadata meta;
  std::string level;
  tvm::ffi::Module library{tvm::ffi::UnsafeInit()};  // keeps the code loaded as long as the VM lives
  tvm::ffi::Module vm{tvm::ffi::UnsafeInit()};
  tvm::ffi::Function main;
  std::vector<std::optional<tvm::ffi::Tensor>> inputs;  // std::optional: value() is a reference, not a copy
  std::vector<tvm::ffi::Tensor> outputs;
  std::vector<std::vector<int64_t>> output_shapes;
};

namespace {

// Runs `body`, turning every exception into a status code and a one-line fk_last_error().
template <typename F>
int Guard(F&& body) {
  try {
    body();
    forgekit::g_last_error.clear();
    return FK_OK;
  } catch (const Failure& e) {
    forgekit::g_last_error = e.what();
    return e.code;
  } catch (const tvm::ffi::Error& e) {
    // an index the model's bounds checks refused (forgekit/passes/index_checks.py): the input's fault, exit 9
    if (e.message().rfind(forgekit::kIndexErrorMarker, 0) == 0) {
      forgekit::g_last_error = forgekit::FirstLine(e.message());
      return FK_ERR_INPUT;
    }
    forgekit::g_last_error = e.kind() + ": " + forgekit::FirstLine(e.message());
    return FK_ERR_RUNTIME;
  } catch (const std::exception& e) {
    forgekit::g_last_error = forgekit::FirstLine(e.what());
    return FK_ERR_RUNTIME;
  }
}

void Open(const std::string& path, const char* key_file, const char* password, fk_model* m) {
  using namespace forgekit;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    throw Failure(FK_ERR_ARTIFACT, "Artifact '" + path + "' does not exist: compile one with 'forgekit compile'.");
  }
  bool is_dir = S_ISDIR(st.st_mode);
  size_t slash = path.rfind('/');
  std::string dir = is_dir ? path : slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  std::string library = is_dir ? JoinPath(path, "model_library.so") : path;
  if (!FileExists(library)) {
    throw Failure(FK_ERR_ARTIFACT, "'" + path + "' has no model_library.so: is it a forgekit artifact directory?");
  }
  std::string meta_path = JoinPath(dir, "metadata.json");
  if (!FileExists(meta_path)) {
    throw Failure(FK_ERR_ARTIFACT, "'" + path + "' has no metadata.json next to its library: the C runtime needs it.");
  }
  m->meta = ReadMetadata(meta_path);
  CheckRunnable(m->meta, "'" + path + "'");
  std::tie(library, m->level) = ChooseLibrary(m->meta, dir, library);
  CheckSize(m->meta, library);
  PromoteTvmLibraries();
  // TVM's workers spin 300000 sched_yields (50-200 ms) after every inference unless told otherwise; read when
  // the pool first starts (forgekit/runtime/loader.py SPIN_COUNT: the same default for the Python runtime)
  setenv("TVM_THREAD_POOL_SPIN_COUNT", "10000", 0);
  if (IsEncrypted(library)) {
    std::string key = key_file ? key_file : JoinPath(dir, "modelKey.bin");
    const char* secret = password ? password : getenv("FORGEKIT_ENCRYPT_PASSWORD");
    if ((!key_file && !FileExists(key)) || !secret) {
      throw Failure(FK_ERR_ENCRYPTION, "Model looks encrypted but no key provided: pass the key file (modelKey.bin) "
                                       "and the password (FORGEKIT_ENCRYPT_PASSWORD).");
    }
    int fd = DecryptToMemfd(library, key, secret);
    try {
      m->library = LoadLibrary(FdPath(fd));
    } catch (const tvm::ffi::Error& e) {
      close(fd);
      throw Failure(FK_ERR_ARTIFACT, "Cannot load the decrypted model library (" + FirstLine(e.message()) +
                                         "): check that it was compiled for this machine and TVM version.");
    }
    close(fd);  // the code stays mapped until the module is freed
  } else {
    // what compile wrote, byte for byte (an encrypted library is authenticated chunk by chunk as it decrypts)
    CheckDigests(m->meta, library, !m->level.empty());
    std::string load_path = LoadPath(library);
    int fd = load_path.empty() ? CopyToMemfd(library) : -1;  // overwritten in place: its bytes from memory
    try {
      m->library = LoadLibrary(fd >= 0 ? FdPath(fd) : load_path);
    } catch (const tvm::ffi::Error& e) {
      if (fd >= 0) close(fd);
      throw Failure(FK_ERR_ARTIFACT, "Cannot load '" + library + "': " + FirstLine(e.message()));
    }
    if (fd >= 0) close(fd);
  }
  if (!m->level.empty()) {
    // a portable artifact's levels may share their weights in one file next to them: mapped and checked now,
    // so a missing or foreign file is a load error, not one at the first inference
    // (forgekit/backends/cpu/shared_weights.py; SHARED_WEIGHTS_CHECK in forgekit/artifact/layout.py)
    if (auto check = m->library->GetFunction("forgekit_shared_weights", true)) {
      try {
        (*check)();
      } catch (const tvm::ffi::Error& e) {
        throw Failure(FK_ERR_ARTIFACT, "Cannot load '" + library + "': " + FirstLine(e.message()));
      }
    }
  }
  auto make_vm = m->library->GetFunction("vm_load_executable", true);
  if (!make_vm) {
    throw Failure(FK_ERR_ARTIFACT, "'" + library + "' is not a Relax VM executable: recompile the artifact.");
  }
  m->vm = (*make_vm)().cast<tvm::ffi::Module>();
  // CPU (DLPack device 1), device 0, pooled allocator (2) for the device and the host: as Engine does
  m->vm->GetFunction("vm_initialization", false).value()(1, 0, 2, 1, 0, 2);
  m->main = m->vm->GetFunction("main", false).value();
  m->inputs.resize(m->meta.inputs.size());
}

}  // namespace

extern "C" {

int fk_open(const char* path, const char* key_file, const char* password, fk_model** model, char* errbuf,
            size_t errbuf_size) {
  if (model) *model = nullptr;
  fk_model* m = nullptr;
  int status = Guard([&] {
    if (!path || !model) throw Failure(FK_ERR_USAGE, "fk_open needs a path and a place for the model handle.");
    m = new fk_model();
    Open(path, key_file, password, m);
  });
  if (status != FK_OK) {
    delete m;
    if (errbuf && errbuf_size) snprintf(errbuf, errbuf_size, "%s", forgekit::g_last_error.c_str());
    return status;
  }
  *model = m;
  return FK_OK;
}

void fk_close(fk_model* model) {
  if (!model) return;
  // outputs and inputs before the VM, the VM before the library whose code it runs
  model->outputs.clear();
  model->inputs.clear();
  delete model;
}

int fk_num_inputs(const fk_model* model) { return model ? static_cast<int>(model->meta.inputs.size()) : -1; }
int fk_num_outputs(const fk_model* model) { return model ? static_cast<int>(model->meta.outputs.size()) : -1; }

int fk_input_index(const fk_model* model, const char* name) {
  for (size_t i = 0; model && name && i < model->meta.inputs.size(); ++i) {
    if (model->meta.inputs[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

static int Describe(const fk_model* model, const std::vector<forgekit::TensorSpec>* specs, int index,
                    fk_tensor_info* info, const char* what) {
  return Guard([&] {
    if (!model || !info) {
      throw Failure(FK_ERR_USAGE, std::string("fk_") + what + "_info needs a model and an info struct.");
    }
    if (index < 0 || index >= static_cast<int>(specs->size())) {
      throw Failure(FK_ERR_USAGE, std::string(what) + " index " + std::to_string(index) +
                                      " is out of range: the model has " + std::to_string(specs->size()) + ".");
    }
    const forgekit::TensorSpec& t = (*specs)[index];
    // metadata.json has one layout for the model ("NCHW"): it describes the tensors of its rank only
    const char* layout = model->meta.layout.size() == t.shape.size() ? model->meta.layout.c_str() : "";
    *info = {t.name.c_str(), t.dtype.c_str(), layout, static_cast<int32_t>(t.shape.size()),
             t.shape.data(), t.symbol_ptrs.data(), t.dim_min.data(), t.dim_max.data(), t.dim_step.data()};
  });
}

int fk_input_info(const fk_model* model, int index, fk_tensor_info* info) {
  return Describe(model, model ? &model->meta.inputs : nullptr, index, info, "input");
}

int fk_output_info(const fk_model* model, int index, fk_tensor_info* info) {
  return Describe(model, model ? &model->meta.outputs : nullptr, index, info, "output");
}

int fk_set_input(fk_model* model, int index, const void* data, const char* dtype, const int64_t* shape,
                 int32_t ndim) {
  return Guard([&] {
    if (!model || !dtype || ndim < 0 || (ndim > 0 && !shape)) {
      throw Failure(FK_ERR_USAGE, "fk_set_input needs a model, a dtype and ndim dims.");
    }
    if (index < 0 || index >= static_cast<int>(model->meta.inputs.size())) {
      throw Failure(FK_ERR_USAGE, "Input index " + std::to_string(index) + " is out of range: the model takes " +
                                      std::to_string(model->meta.inputs.size()) + " input(s).");
    }
    const forgekit::TensorSpec& t = model->meta.inputs[index];
    std::vector<int64_t> got(shape, shape + ndim);
    const std::string name = "Input '" + t.name + "'";
    if (t.dtype != dtype) {
      throw Failure(FK_ERR_INPUT, name + " has dtype " + dtype + "; the model expects " + t.dtype + ".");
    }
    if (got.size() != t.shape.size()) {
      throw Failure(FK_ERR_INPUT, name + " has shape " + forgekit::Shape(got) + " (" + std::to_string(ndim) +
                                      " dimensions); the model expects " + forgekit::Shape(t.shape, &t.symbols) + " (" +
                                      std::to_string(t.shape.size()) + " dimensions).");
    }
    for (size_t axis = 0; axis < got.size(); ++axis) {
      std::string dim = " (dimension " + std::to_string(axis) + ")";
      if (t.shape[axis] >= 0 && got[axis] != t.shape[axis]) {
        throw Failure(FK_ERR_INPUT, name + " has shape " + forgekit::Shape(got) + "; the model expects " +
                                        forgekit::Shape(t.shape, &t.symbols) + " (dimension " + std::to_string(axis) +
                                        " must be " + std::to_string(t.shape[axis]) + ").");
      }
      if (t.shape[axis] >= 0) continue;
      const std::string& sym = t.symbols[axis];
      const std::string served =
          name + " has " + sym + "=" + std::to_string(got[axis]) + dim + "; this artifact serves " + sym;
      if (got[axis] < t.dim_min[axis] || (t.dim_max[axis] >= 0 && got[axis] > t.dim_max[axis])) {
        std::string high = t.dim_max[axis] >= 0 ? std::to_string(t.dim_max[axis]) : "any size";
        throw Failure(FK_ERR_INPUT, served + " from " + std::to_string(t.dim_min[axis]) + " to " + high + ".");
      }
      if (got[axis] % t.dim_step[axis]) {
        throw Failure(FK_ERR_INPUT, served + " in multiples of " + std::to_string(t.dim_step[axis]) + " only.");
      }
    }
    const forgekit::DtypeName* type = forgekit::FindDtype(dtype);
    if (!type) throw Failure(FK_ERR_USAGE, std::string("Unknown dtype '") + dtype + "'.");
    std::optional<tvm::ffi::Tensor>& slot = model->inputs[index];
    // A fresh buffer unless this input's own one fits and nothing else holds it: an output of the last run
    // may alias an input (an identity model), and it must stay as fk_get_output returned it.
    if (!slot.has_value() || !slot.value().unique() ||
        std::vector<int64_t>(slot.value().shape().begin(), slot.value().shape().end()) != got) {
      slot = tvm::ffi::Tensor::FromNDAlloc(forgekit::AlignedAlloc(), tvm::ffi::ShapeView(got.data(), got.size()),
                                           type->type, DLDevice{kDLCPU, 0});
      if (!slot.value().data_ptr()) throw Failure(FK_ERR_RUNTIME, name + ": out of memory.");
    }
    size_t bytes = tvm::ffi::GetDataSize(slot.value());
    if (bytes && !data) throw Failure(FK_ERR_USAGE, name + ": data is NULL.");
    if (bytes) std::memcpy(slot.value().data_ptr(), data, bytes);
  });
}

int fk_run(fk_model* model) {
  return Guard([&] {
    if (!model) throw Failure(FK_ERR_USAGE, "fk_run needs a model.");
    std::map<std::string, std::pair<int64_t, std::string>> bound;  // symbol -> (value, input that set it)
    std::vector<tvm::ffi::AnyView> args;
    for (size_t i = 0; i < model->inputs.size(); ++i) {
      const forgekit::TensorSpec& t = model->meta.inputs[i];
      if (!model->inputs[i].has_value()) {
        throw Failure(FK_ERR_INPUT, "Input '" + t.name + "' was not set: call fk_set_input for every input before "
                                    "fk_run.");
      }
      tvm::ffi::ShapeView shape = model->inputs[i].value().shape();
      for (size_t axis = 0; axis < t.shape.size(); ++axis) {
        if (t.shape[axis] >= 0) continue;
        auto seen = bound.emplace(t.symbols[axis], std::make_pair(shape[axis], t.name)).first->second;
        if (seen.first != shape[axis]) {
          const std::string& sym = t.symbols[axis];
          throw Failure(FK_ERR_INPUT, "Input '" + t.name + "' has " + sym + "=" + std::to_string(shape[axis]) +
                                          " but input '" + seen.second + "' has " + sym + "=" +
                                          std::to_string(seen.first) + ": dimensions with the same name must agree.");
        }
      }
      args.emplace_back(model->inputs[i].value());
    }
    model->outputs.clear();
    model->output_shapes.clear();
    tvm::ffi::Any result;
    model->main.CallPacked(args.data(), static_cast<int32_t>(args.size()), &result);
    forgekit::Flatten(result, &model->outputs);
    for (const tvm::ffi::Tensor& out : model->outputs) {
      if (out.device().device_type != kDLCPU || !out.IsContiguous()) {
        throw Failure(FK_ERR_RUNTIME, "The model returned a non-contiguous or non-CPU tensor: not supported here.");
      }
      model->output_shapes.emplace_back(out.shape().begin(), out.shape().end());
    }
  });
}

int fk_get_output(fk_model* model, int index, fk_tensor* out) {
  return Guard([&] {
    if (!model || !out) throw Failure(FK_ERR_USAGE, "fk_get_output needs a model and an output struct.");
    if (model->outputs.empty()) throw Failure(FK_ERR_USAGE, "No outputs yet: call fk_run first.");
    if (index < 0 || index >= static_cast<int>(model->outputs.size())) {
      throw Failure(FK_ERR_USAGE, "Output index " + std::to_string(index) + " is out of range: the model returned " +
                                      std::to_string(model->outputs.size()) + " output(s).");
    }
    const tvm::ffi::Tensor& t = model->outputs[index];
    *out = {static_cast<const char*>(t.data_ptr()) + t.byte_offset(), forgekit::DtypeOf(t.dtype()), t.ndim(),
            model->output_shapes[index].data(), tvm::ffi::GetDataSize(t)};
  });
}

const char* fk_last_error(void) { return forgekit::g_last_error.c_str(); }
const char* fk_level(const fk_model* model) { return model ? model->level.c_str() : ""; }

}  // extern "C"
